"""Helpers and tool modules the tests share (workers load the tool modules by dotted name)."""
