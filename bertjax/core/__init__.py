"""The layer every other builds on: the error type, the run config's skeleton, command-line plumbing, the
process runtime, sharding rules and the metric values that add up on device."""
