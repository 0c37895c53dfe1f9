"""A vidloom fleet on Ray Serve: an OpenAI-compatible ingress routing jobs to model replicas."""
