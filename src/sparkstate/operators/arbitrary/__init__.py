"""Arbitrary state: applyInPandasWithState, flatMapGroupsWithState, transformWithState and the
state a user's function touches (GroupState, state variables, timers, TTL)."""
