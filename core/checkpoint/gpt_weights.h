// io::gpt_weights: a GPT's weights in the formats people already have (nanoGPT's init_from):
// llm.c's model file (f32 or bf16), Hugging Face's GPT-2 safetensors, a nanoGPT-layout
// safetensors file (ditto's own model.safetensors) and a ditto checkpoint directory; and
// llm.c's and Hugging Face's files written from a trained model (--export).
//
// Note [llm.c model file]
// (llm.c train_gpt2.py write_model, read by train_gpt2.c / train_gpt2.cu
// gpt2_build_from_checkpoint)
//   256 int32 little-endian: [0] 20240326 (magic), [1] version: 3 = f32 parameters, 5 = bf16,
//   [2] max_seq_len (block_size), [3] vocab_size, [4] num_layers, [5] num_heads, [6] channels
//   (n_embd), [7] padded_vocab_size (>= vocab_size; llm.c pads 50257 to 50304); the rest 0.
//   Then every parameter, f32 or bf16, in this order, each layer-major (all layers' ln1w, then
//   all layers' ln1b, ...): wte [Vp, C] (the vocabulary padded), wpe [T, C], ln1w [L, C],
//   ln1b [L, C], qkvw [L, 3C, C], qkvb [L, 3C], attprojw [L, C, C], attprojb [L, C], ln2w [L, C],
//   ln2b [L, C], fcw [L, 4C, C], fcb [L, 4C], fcprojw [L, C, 4C], fcprojb [L, C], lnfw [C],
//   lnfb [C]. The weights are nanoGPT's nn.Linear layout [out, in], as write_model writes the
//   state_dict's tensors; GPT-2 has every bias. The file is exactly 1024 bytes + the parameters.
// Padded vocabulary: llm.c computes its softmax and loss over the first vocab_size logits only
// and never reads wte's rows [vocab_size, padded_vocab_size) (it writes them as zeros), so ditto
// builds a GPT of vocab_size rows and drops the padded ones: its logits and loss are llm.c's.
// save_llmc_model pads wte back with zero rows to a multiple of 128 (write_model's pad_vocab).
//
// Note [GPT-2 safetensors]
// Hugging Face's GPT-2 (transformers' GPT2Model / GPT2LMHeadModel, model.safetensors): the names
// of nanoGPT's state_dict without the "transformer." prefix in the hub's gpt2 file
// ("wte.weight", "h.0.attn.c_attn.weight", ...) or with it (GPT2LMHeadModel.save_pretrained),
// also after torch.compile's "_orig_mod." or DDP's "module." (a nanoGPT state_dict saved from its
// compiled or DDP-wrapped model: taken off, as nanoGPT's train.py does; errors name the stored
// key); attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights are Conv1D's [in, out], the
// transpose of nanoGPT's Linear [out, in] (nanoGPT's from_pretrained transposes them);
// "lm_head.weight", when present, must equal wte (the head is tied, as in GPT-2); the attention
// mask buffers "h.N.attn.bias" and "h.N.attn.masked_bias" are not parameters and are ignored
// (of any dtype: BOOL in the files of some transformers versions, F32 in the hub's gpt2).
// Every other name, a missing parameter or a shape that does not fit is refused. F32, BF16 and
// F16 tensors are read (converted to f32 exactly). The file has no n_head: it is taken from
// __metadata__ "ditto.n_head" (ditto's export writes it), else the "model" of a ditto trainer.json
// beside the file (a checkpoint's DIR/step-N/model.safetensors), else "n_head" of a config.json
// beside the file (a Hugging Face model directory; one that is not a JSON object is refused,
// and so is one that describes another model: Note [GPT-2 config.json], gpt_weights.cpp),
// else the GPT-2 size with this n_layer and n_embd
// (gpt2_presets: 12 heads for 768 wide, ...), else the caller's n_head_hint (--n-head).
// A safetensors file whose c_attn weight is [3C, C] has nanoGPT's layout (ditto's checkpoint
// model.safetensors, a nanoGPT state_dict): read the same way, without the transposes.
//
// Note [Checkpoint vocabulary]
// A character model's token ids are ranks in its text's vocabulary (Note [Text batches]), so
// its weights mean nothing without that vocabulary: id 5 is ',' in a model of Shakespeare and
// '-' in one of a lower-cased copy. A ditto checkpoint of a run on a text records it
// (trainer.json's "vocab", the bytes in hex in token order), and load_gpt_weights returns it
// (GptWeights::vocab) from a checkpoint directory and from a model.safetensors with that
// trainer.json beside it. A run that starts from such weights on a text (--init-from, with or
// without --eval-only) encodes the text, and decodes its sample, with the checkpoint's
// vocabulary instead of the text's own, as nanoGPT fine-tunes by reusing meta.pkl's stoi / itos;
// a text holding a byte the vocabulary lacks is refused naming it (there is no id for it).
// Before, the text's own vocabulary was used whenever it was not larger: another text's ids then
// meant other characters (a validation loss above the uniform one, a garbled sample).
// llm.c and Hugging Face files record no vocabulary (their ids are the tokenizer's).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/gpt_config.h"
#include "core/nn/module.h"
#include "core/runtime/tensor.h"

namespace ditto::io {

/// llm.c's model file constants (Note [llm.c model file]).
inline constexpr std::int32_t kLlmcModelMagic = 20240326;
inline constexpr std::int32_t kLlmcVersionF32 = 3, kLlmcVersionBf16 = 5;
inline constexpr std::int64_t kLlmcHeaderBytes = 256 * 4;

/// Where a GPT's weights came from.
enum class GptWeightsFormat : std::uint8_t {
  llmc,        ///< llm.c model file (Note [llm.c model file])
  hf,          ///< Hugging Face GPT-2 safetensors (Note [GPT-2 safetensors])
  nanogpt,     ///< safetensors in nanoGPT's layout (ditto's model.safetensors)
  checkpoint,  ///< a ditto checkpoint directory (core/checkpoint/checkpoint.h)
};

/// A GPT's configuration and parameters as read from a file.
struct GptWeights {
  GptWeightsFormat format = GptWeightsFormat::llmc;
  /// The file's model: block_size, vocab_size (llm.c: the unpadded one), n_layer, n_head,
  /// n_embd, bias; dropout 0 (no file records it).
  nn::GPTConfig config;
  /// Every parameter with nanoGPT's name, in nn::GPT's parameters() order, f32 host tensors of
  /// nn::GPT's shapes (gpt_param_specs).
  std::vector<std::pair<std::string, Tensor>> params;
  /// "llm.c model file (f32, version 3)", "Hugging Face GPT-2 safetensors", ...
  std::string description;
  /// Where n_head came from ("the header", "config.json", "the GPT-2 size gpt2", ...); empty
  /// when the file does not say and n_head_hint gave it.
  std::string n_head_from;
  /// llm.c: the header's padded_vocab_size (its rows dropped); otherwise config.vocab_size.
  std::int64_t padded_vocab_size = 0;
  /// A character model's vocabulary: the byte of token id t at [t] (TextDataSource's itos), as
  /// the trainer.json of a ditto checkpoint of a run on a text records it ("vocab"; the
  /// checkpoint directory's, or the one beside its model.safetensors). Empty when the file
  /// records none (llm.c, Hugging Face, a checkpoint of a run on token files). Note [Checkpoint
  /// vocabulary].
  std::vector<unsigned char> vocab;
  /// The trainer.json `vocab` was read from ("" when empty).
  std::string vocab_from;
};

/// nanoGPT's parameter names and shapes of a GPT of `cfg`, in nn::GPT's parameters() order
/// (Note [GPT] in core/nn/gpt.h): the biases only with cfg.bias. Throws InvalidArgument
/// "io::gpt_param_specs: " and nn::check_config's message for a config no nn::GPT can have
/// (n_layer <= 0, a size < 1, n_embd % n_head != 0, ...).
std::vector<std::pair<std::string, Shape>> gpt_param_specs(const nn::GPTConfig& cfg);

/// Read a GPT's weights from `path`, its format told by content, not by name: a directory with
/// a checkpoint's entries (latest, lock, step-N, trainer.json) is a ditto checkpoint (DIR, its
/// newest usable one, or DIR/step-N); another directory with a model.safetensors (a Hugging Face
/// download folder) is that file; a file starting with the int32
/// 20240326 an llm.c model file; any other file a safetensors file (Hugging Face's GPT-2 or
/// nanoGPT's layout, told by the c_attn weight's shape). `n_head_hint` (> 0): the heads when the
/// file does not record them (Note [GPT-2 safetensors]); ignored when it does. Throws ParseError
/// naming the file and what was expected: a bad magic or version, header sizes that are not
/// positive or do not fit (n_embd % n_head, padded_vocab_size < vocab_size), a file size other
/// than the header describes (truncated or too long), an unknown / missing name or a shape that
/// does not fit, a dtype that is not F32 / BF16 / F16, an untied lm_head, a checkpoint of
/// another model, a config.json beside it that is not a JSON object, a directory that is neither
/// a checkpoint nor holds a model.safetensors, a NaN or infinity in a parameter (of any file
/// dtype; named by nanoGPT's state_dict key with the index of its first one); ditto::Error
/// (InvalidArgument) when n_head cannot be told.
GptWeights load_gpt_weights(const std::string& path, std::int64_t n_head_hint = 0);

/// Copy `w`'s parameters into `model`'s (an nn::GPT of w.config, parameters on any device and
/// of any float dtype, converted from f32). Throws InvalidArgument naming the parameter when a
/// name or shape differs. Blocks.
void load_gpt_params(nn::Module& model, const GptWeights& w);

/// Every parameter of `model` by name, converted to f32 on the host (blocks).
std::vector<std::pair<std::string, Tensor>> gpt_params_f32(nn::Module& model);

/// The bytes of an llm.c model file (Note [llm.c model file]) of a GPT of `cfg` (bias true:
/// llm.c has every bias) holding `params` (gpt_param_specs' names and shapes, any float dtype,
/// host or device), in `dtype` f32 (version 3) or bf16 (version 5, rounded to nearest even as
/// torch's .to(torch.bfloat16)); wte padded with zero rows to a multiple of 128. Throws
/// InvalidArgument for a model without biases, another dtype, or a name / shape that differs.
std::string llmc_model_serialize(const nn::GPTConfig& cfg,
                                 const std::vector<std::pair<std::string, Tensor>>& params,
                                 DType dtype);

/// Hugging Face's GPT-2 tensors (Note [GPT-2 safetensors]): GPT2LMHeadModel's names
/// ("transformer.h.0.attn.c_attn.weight", ...) without the tied lm_head.weight, the four Conv1D
/// weights transposed, f32 host tensors. Same refusals as llmc_model_serialize.
std::vector<std::pair<std::string, Tensor>> hf_gpt2_tensors(
    const nn::GPTConfig& cfg, const std::vector<std::pair<std::string, Tensor>>& params);

/// Write `params` as an llm.c model file (llmc_model_serialize) to `path` atomically
/// (io::write_file_atomic: temporary file, fsync, rename; never half-written).
void save_llmc_model(const std::string& path, const nn::GPTConfig& cfg,
                     const std::vector<std::pair<std::string, Tensor>>& params, DType dtype);

/// Write `params` as Hugging Face GPT-2 safetensors (hf_gpt2_tensors; __metadata__ "format":
/// "pt" as transformers writes, and "ditto.n_head") to `path` atomically.
void save_hf_gpt2(const std::string& path, const nn::GPTConfig& cfg,
                  const std::vector<std::pair<std::string, Tensor>>& params);

}  // namespace ditto::io
