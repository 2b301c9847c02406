"""The rig: a server setup's step time and overhead per level, its file, and what it recommends for a workload."""
