//! Worker: replays a slice of a recording.
