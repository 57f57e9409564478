"""Plan search, memory-budget planners, time/cost to train, and launchable exports."""
