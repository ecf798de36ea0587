"""ftbus's common library: events, codec, subjects, bus runtime, artifacts, runners, settings, CLI."""
