"""Any other diffusers pipeline, run by diffusers itself as one loop the runtime drives step by step."""
