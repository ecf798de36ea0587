"""ftbus: evaluate LLM fine-tuning candidates over NATS JetStream."""
