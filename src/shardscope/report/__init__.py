"""Human-readable and machine-readable reports of estimates and validations."""
