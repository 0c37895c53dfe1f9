"""Demo checkpoints: tiny real architectures with seeded random weights, written once into the user's cache.

A family's demo module declares its configs and its weight folders and lets this kit write them:
`writer.Part` (one weights folder: how to build the module, its name map, its config, how its zero-initialised
weights are filled) and `writer.write_parts`, `writer.model_index`, `writer.write_pipeline_files`;
`tokenizer` (the offline-trained tokenizers); `cache.DemoCheckpoint` (the versioned cache entry, written
atomically). No demo imports another family's: parts two families share live here or in vidloom/models.
"""
