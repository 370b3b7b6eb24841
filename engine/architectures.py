"""The checkpoint architectures Hydrant serves, by their `config.json` names.

Plain data, no torch: the engine's config reader, the capacity calculator and the
platform's checkpoint check (API nodes have no torch) all read these one lists.
"""

from __future__ import annotations

SUPPORTED_ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"}
)
# Checkpoints of the bare decoder (no LM head), as embedding models ship them
# (e5-mistral's `MistralModel`): served for embeddings only, in the family they name.
EMBEDDING_ARCHITECTURES = {
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",
    "Qwen2Model": "Qwen2ForCausalLM",
    "Qwen3Model": "Qwen3ForCausalLM",
}
