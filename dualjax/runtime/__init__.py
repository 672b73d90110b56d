"""The machine: device meshes and sharding, the allocator, progress lines."""
