"""Cost models: compute (roofline x op-class efficiency), communication, memory."""
