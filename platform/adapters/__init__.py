"""LoRA adapters: the registry per base model, its validation, and the gateway's copy of it."""
