"""The per-stage, per-micro-batch costs of a step that both engines read (the analytic closed form and
the discrete-event simulator): layer and stage costs, data-parallel communication, memory per rank."""
