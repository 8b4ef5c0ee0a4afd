// Published config.json hyper-parameters of real models (from their Hugging Face model cards),
// written out for the planner tests. Only the fields the planner reads, plus a few others as the
// real files have them.

#ifndef KVSERVE_TESTS_WORKER_PLANNER_MODEL_CONFIGS_H_
#define KVSERVE_TESTS_WORKER_PLANNER_MODEL_CONFIGS_H_

namespace kvserve::testing_configs {

inline constexpr char kLlama3_8B[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
  "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "attention_bias": false,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu"})";

inline constexpr char kLlama2_7B[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
  "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
  "torch_dtype": "float16", "pretraining_tp": 1, "rope_scaling": null})";

inline constexpr char kLlama3_70B[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
  "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
  "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16"})";

inline constexpr char kMistral7B[] = R"({
  "architectures": ["MistralForCausalLM"], "model_type": "mistral",
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
  "max_position_embeddings": 32768, "sliding_window": 4096, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";

inline constexpr char kQwen2_7B[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
  "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
  "max_position_embeddings": 131072, "max_window_layers": 28, "sliding_window": 131072,
  "use_sliding_window": false, "rope_theta": 1000000.0, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16"})";

inline constexpr char kMixtral8x7B[] = R"({
  "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
  "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768,
  "sliding_window": null, "rope_theta": 1000000.0, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16"})";

inline constexpr char kDeepSeekV2[] = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
  "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
  "num_hidden_layers": 60, "num_attention_heads": 128, "num_key_value_heads": 128,
  "vocab_size": 102400, "n_routed_experts": 160, "n_shared_experts": 2,
  "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
  "v_head_dim": 128, "max_position_embeddings": 163840, "topk_method": "group_limited_greedy",
  "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";

inline constexpr char kDeepSeekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
  "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
  "vocab_size": 129280, "n_routed_experts": 256, "n_shared_experts": 1,
  "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
  "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
  "max_position_embeddings": 163840, "topk_method": "noaux_tc", "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                          "quant_method": "fp8", "weight_block_size": [128, 128]}})";

inline constexpr char kDeepSeekV2Lite[] = R"({
  "model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
  "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
  "num_key_value_heads": 16, "vocab_size": 102400, "n_routed_experts": 64,
  "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
  "q_lora_rank": null, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
  "v_head_dim": 128, "max_position_embeddings": 163840, "torch_dtype": "bfloat16"})";

inline constexpr char kGpt2[] = R"({
  "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12,
  "n_head": 12, "n_ctx": 1024, "n_positions": 1024, "vocab_size": 50257})";

}  // namespace kvserve::testing_configs

#endif  // KVSERVE_TESTS_WORKER_PLANNER_MODEL_CONFIGS_H_
