"""What two or more services use: events, codec, subjects, bus, runtime, runners, artifacts, settings, records, logs."""
