// io::gpt_weights: llm.c's model file, Hugging Face's GPT-2 safetensors, nanoGPT-layout
// safetensors and ditto checkpoints in; llm.c's and Hugging Face's files out (gpt_weights.h).
#include "core/checkpoint/gpt_weights.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/base/error.h"
#include "core/checkpoint/checkpoint.h"
#include "core/io/file.h"
#include "core/io/safetensors.h"

namespace ditto::io {

namespace {

namespace fs = std::filesystem;
using Named = std::vector<std::pair<std::string, Tensor>>;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw ParseError(detail::cat("io::load_gpt_weights: '", path, "': ", what));
}

// A block's parameters in nanoGPT's order (Note [GPT]), with their shapes for width C.
struct BlockParam {
  const char* name;  // after "transformer.h.<l>."
  bool is_bias;
  bool conv1d;              // Hugging Face stores it transposed (Conv1D)
  std::int64_t rows, cols;  // in multiples of C (cols 0: a vector)
};
const std::vector<BlockParam>& block_params() {
  static const std::vector<BlockParam> p = {
      {"ln_1.weight", false, false, 1, 0},       {"ln_1.bias", true, false, 1, 0},
      {"attn.c_attn.weight", false, true, 3, 1}, {"attn.c_attn.bias", true, false, 3, 0},
      {"attn.c_proj.weight", false, true, 1, 1}, {"attn.c_proj.bias", true, false, 1, 0},
      {"ln_2.weight", false, false, 1, 0},       {"ln_2.bias", true, false, 1, 0},
      {"mlp.c_fc.weight", false, true, 4, 1},    {"mlp.c_fc.bias", true, false, 4, 0},
      {"mlp.c_proj.weight", false, true, 1, 4},  {"mlp.c_proj.bias", true, false, 1, 0}};
  return p;
}

std::string block_name(std::int64_t l, const char* p) {
  return "transformer.h." + std::to_string(l) + "." + p;
}

Shape block_shape(const BlockParam& p, std::int64_t C) {
  if (p.cols == 0) return {p.rows * C};
  return {p.rows * C, p.cols * C};
}

// A host f32 tensor of `shape` from `n` elements of `dtype` at `src`.
Tensor host_f32(const void* src, DType dtype, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32, Device::cpu());
  detail::cast_on_host(src, dtype, t.data_ptr(), DType::f32, t.numel());
  return t;
}

// The 2-D transpose of a host f32 tensor.
Tensor transposed(const Tensor& t) {
  const std::int64_t r = t.size(0), c = t.size(1);
  Tensor out = Tensor::empty({c, r}, DType::f32, Device::cpu());
  const float* s = t.data<float>();
  float* d = out.data<float>();
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j) d[j * r + i] = s[i * c + j];
  return out;
}

// Checks that `params` holds gpt_param_specs(cfg) exactly (names, order, shapes), for `call`.
void check_params(const nn::GPTConfig& cfg, const Named& params, const char* call) {
  const auto specs = gpt_param_specs(cfg);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [n, t] : params) by_name[n] = &t;
  for (const auto& [name, shape] : specs) {
    auto it = by_name.find(name);
    DITTO_CHECK(it != by_name.end(), call, ": expected a parameter '", name, "' ", shape_str(shape),
                ", got none");
    DITTO_CHECK(it->second->defined() && it->second->shape() == shape &&
                    nn::is_float_storage(it->second->dtype()),
                call, ": parameter '", name, "': expected an f32 / bf16 / f16 tensor ",
                shape_str(shape), ", got ",
                it->second->defined() ? detail::cat(dtype_name(it->second->dtype()), " ",
                                                    shape_str(it->second->shape()))
                                      : std::string("an undefined tensor"));
  }
  DITTO_CHECK(params.size() == specs.size(), call, ": expected the ", specs.size(),
              " parameters of ", cfg.n_layer, " layers", cfg.bias ? " with biases" : "", ", got ",
              params.size());
}

std::map<std::string, Tensor> host_by_name(const Named& params) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : params) m[n] = t.to(Device::cpu(), DType::f32);
  return m;
}

void check_config_or_bad(const std::string& path, const nn::GPTConfig& c) {
  try {
    nn::check_config(c);
  } catch (const InvalidArgument& e) {
    bad(path, detail::cat("the model it describes is not one ditto's GPT can be: ", e.what()));
  }
}

// ---- llm.c ------------------------------------------------------------------------------------

// `v` in decimal (detail::cat prints no 128-bit integer).
std::string u128_str(unsigned __int128 v) {
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return s;
}

GptWeights load_llmc(const std::string& path) {
  InputFile in(path, std::numeric_limits<std::uint64_t>::max(), "io::load_gpt_weights");
  if (in.size() < static_cast<std::uint64_t>(kLlmcHeaderBytes))
    bad(path, detail::cat("an llm.c model file starts with a header of 256 int32 (1024 bytes), "
                          "got a file of ",
                          in.size(), " bytes (truncated)"));
  std::string head;
  in.read(head, kLlmcHeaderBytes);
  std::int32_t h[256];
  std::memcpy(h, head.data(), sizeof h);
  if (h[0] != kLlmcModelMagic)
    bad(path, detail::cat("header[0] (magic): expected ", kLlmcModelMagic,
                          " (an llm.c model file), got ", h[0]));
  if (h[1] != kLlmcVersionF32 && h[1] != kLlmcVersionBf16)
    bad(path, detail::cat("header[1] (version): expected 3 (f32) or 5 (bf16), got ", h[1],
                          h[1] == 1 || h[1] == 2 ? " (an llm.c file from before the padded "
                                                   "vocabulary: write it again with today's "
                                                   "train_gpt2.py)"
                                                 : ""));
  const char* fields[] = {"",           "",          "max_seq_len", "vocab_size",
                          "num_layers", "num_heads", "channels",    "padded_vocab_size"};
  for (int i = 2; i <= 7; ++i)
    if (h[i] < 1)
      bad(path, detail::cat("header[", i, "] (", fields[i], "): expected >= 1, got ", h[i]));
  if (h[7] < h[3])
    bad(path, detail::cat("header[7] (padded_vocab_size): expected >= vocab_size = ", h[3],
                          ", got ", h[7]));
  nn::GPTConfig c;
  c.block_size = h[2];
  c.vocab_size = h[3];
  c.n_layer = h[4];
  c.n_head = h[5];
  c.n_embd = h[6];
  c.bias = true;
  c.dropout = 0.0f;
  check_config_or_bad(path, c);
  const std::int64_t Vp = h[7], C = c.n_embd, L = c.n_layer;
  const DType dt = h[1] == kLlmcVersionF32 ? DType::f32 : DType::bf16;
  const std::uint64_t elem = dtype_size(dt);
  // Parameters: (Vp + T) C + L (12 C^2 + 13 C) + 2 C. Every field is < 2^31, but the sum is not
  // bounded by 2^64 (12 C^2 alone passes it for C near 2^31; L x 12 C^2 reaches 2^97): in 128
  // bits it is exact (< 2^99, and its bytes < 2^101). In 64 bits a crafted header wrapped to a
  // size that matched its 1024 bytes (tester hB, 7).
  using u128 = unsigned __int128;
  const u128 n = u128(std::uint64_t(Vp + c.block_size)) * std::uint64_t(C) +
                 u128(std::uint64_t(L)) * (u128(12) * std::uint64_t(C) * std::uint64_t(C) +
                                           u128(13) * std::uint64_t(C)) +
                 u128(2) * std::uint64_t(C);
  const u128 want = u128(std::uint64_t(kLlmcHeaderBytes)) + n * elem;
  if (u128(in.size()) != want)
    bad(path, detail::cat("the header (", dt == DType::f32 ? "f32" : "bf16", ", max_seq_len ",
                          c.block_size, ", vocab_size ", c.vocab_size, " padded to ", Vp, ", ", L,
                          " layers, ", c.n_head, " heads, channels ", C, ") describes ",
                          u128_str(n), " parameters: expected a file of ", u128_str(want),
                          " bytes, got ", in.size(), " bytes",
                          want > u128(std::numeric_limits<std::int64_t>::max())
                              ? " (more than any file holds: sizes no model file has)"
                          : u128(in.size()) < want ? " (truncated)"
                                                   : " (bytes past the parameters)"));
  GptWeights w;
  w.format = GptWeightsFormat::llmc;
  w.config = c;
  w.padded_vocab_size = Vp;
  w.n_head_from = "the header";
  w.description =
      dt == DType::f32 ? "llm.c model file (f32, version 3)" : "llm.c model file (bf16, version 5)";
  std::map<std::string, Tensor> got;
  std::string buf;
  // Reads `rows` x (the rest of `shape`) elements and keeps the first shape[0] rows.
  auto read = [&](const Shape& shape, std::int64_t rows = 0) {
    std::int64_t count = rows > 0 ? rows : shape[0];
    for (std::size_t i = 1; i < shape.size(); ++i) count *= shape[i];
    buf.clear();
    in.read(buf, static_cast<std::uint64_t>(count) * elem);
    return host_f32(buf.data(), dt, shape);
  };
  // wte: the first vocab_size rows of the padded [Vp, C] (Note [llm.c model file]).
  got["transformer.wte.weight"] = read({c.vocab_size, C}, Vp);
  got["transformer.wpe.weight"] = read({c.block_size, C});
  for (const BlockParam& p : block_params())
    for (std::int64_t l = 0; l < L; ++l) got[block_name(l, p.name)] = read(block_shape(p, C));
  got["transformer.ln_f.weight"] = read({C});
  got["transformer.ln_f.bias"] = read({C});
  for (const auto& [name, shape] : gpt_param_specs(c)) w.params.emplace_back(name, got.at(name));
  return w;
}

// ---- safetensors (Hugging Face or nanoGPT layout) ---------------------------------------------

fs::path config_json_path(const std::string& path) {
  return fs::path(path).parent_path() / "config.json";
}

// The config.json beside `path` (a Hugging Face model directory), parsed once for
// n_head_from_config_json and check_config_json; null when there is none. A config.json that is
// not a JSON object is refused (ParseError naming it and what is wrong): ignoring it would only
// fail later, on a missing n_head, without saying why.
nlohmann::json read_config_json(const std::string& path) {
  const fs::path cfg = config_json_path(path);
  std::error_code ec;
  if (!fs::is_regular_file(cfg, ec)) return nullptr;
  std::string text = read_file(cfg.string(), kMaxJsonBytes, "io::load_gpt_weights");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ParseError(detail::cat("io::load_gpt_weights: '", cfg.string(),
                                 "' (the config.json "
                                 "beside '",
                                 path, "'): could not be parsed as JSON: ", e.what()));
  }
  DITTO_CHECK_T(ParseError, j.is_object(), "io::load_gpt_weights: '", cfg.string(),
                "' (the config.json beside '", path, "'): expected a JSON object, got ",
                j.type_name());
  return j;
}

// n_head from `j`, read_config_json(path)'s; 0 when there is none or it has no n_head.
std::int64_t n_head_from_config_json(const std::string& path, const nlohmann::json& j,
                                     std::string& from) {
  if (j.is_null() || !j.contains("n_head")) return 0;
  const std::string cfg = config_json_path(path).string();
  const auto& v = j["n_head"];
  DITTO_CHECK_T(ParseError, v.is_number_integer() && v.get<std::int64_t>() >= 1,
                "io::load_gpt_weights: '", cfg,
                "': n_head: expected an integer >= 1, "
                "got ",
                v.dump());
  from = cfg;
  return v.get<std::int64_t>();
}

// Note [GPT-2 config.json]
// Hugging Face's config.json beside a model.safetensors says more than n_head: a model of another
// architecture (model_type), activation (activation_function), LayerNorm epsilon
// (layer_norm_epsilon) or attention scaling (scale_attn_weights, and
// scale_attn_by_inverse_layer_idx: transformers' GPT2Attention divides layer i's scores by i + 1
// too, as the stanford-crfm Mistral GPT-2 checkpoints set) would load and compute something else
// without a word, and sizes that contradict the tensors (n_inner, the MLP's width, 4 x n_embd in
// GPT-2 and the only one ditto's GPT has) mean the file is not the one the config describes.
// Each is refused naming the key, what ditto's GPT-2 expects and what the file says; keys left
// out are HF's defaults, which are ditto's. Accepted whatever they say: reorder_and_upcast_attn
// (it computes the scores in f32 under autocast, as ditto does in every dtype: a precision
// choice, not another function), add_cross_attention (its crossattention tensors, if the file
// has them, are refused as unknown names; without an encoder's states GPT2Block skips them),
// the dropouts (attn_pdrop, resid_pdrop, embd_pdrop: --dropout's, none at evaluation), n_ctx
// (older transformers' copy of n_positions, unused) and the rest (tokenizer ids, the summary_*
// of GPT2DoubleHeadsModel, use_cache, initializer_range), which do not change the causal LM.
// `j`: read_config_json(path)'s (null: no config.json, nothing to check).
void check_config_json(const std::string& path, const nlohmann::json& j, const nn::GPTConfig& c) {
  if (j.is_null()) return;
  const fs::path cfg = config_json_path(path);
  auto refuse = [&](const char* key, const std::string& expected, const std::string& got_is = "") {
    throw InvalidArgument(detail::cat("io::load_gpt_weights: '", cfg.string(),
                                      "' (the config.json beside '", path, "'): ", key,
                                      ": expected ", expected, ", got ", j[key].dump(), got_is));
  };
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    refuse("model_type", "\"gpt2\" (ditto's GPT is GPT-2's architecture)");
  // transformers' names (ACT2FN): "gelu_new" (GPT2Config's default), "gelu_pytorch_tanh" and
  // "gelu_fast" are the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the
  // one GELU ditto computes (sim and CUDA kernels); "gelu" (and "gelu_python") is the exact erf
  // GELU x Phi(x) (PyTorch's nn.GELU(), nanoGPT's), a different function (up to 4.7e-4 apart):
  // refused, as any other ("relu", "silu", "tanh", "quick_gelu", ...).
  if (j.contains("activation_function")) {
    const auto& act = j["activation_function"];
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast") {
      const bool erf = act == "gelu" || act == "gelu_python";
      refuse("activation_function",
             "\"gelu_new\", \"gelu_pytorch_tanh\" or \"gelu_fast\" (GPT-2's tanh GELU, the "
             "only activation ditto computes)",
             erf ? " (transformers' exact erf GELU, nn.GELU(): ditto would compute this model "
                   "with the tanh GELU, another function; if it was trained with the tanh GELU, "
                   "set \"gelu_new\" in the config.json)"
                 : "");
    }
  }
  if (j.contains("layer_norm_epsilon") &&
      !(j["layer_norm_epsilon"].is_number() && j["layer_norm_epsilon"].get<double>() == 1e-5))
    refuse("layer_norm_epsilon", "1e-05 (GPT-2's and ditto's LayerNorm epsilon)");
  if (j.contains("scale_attn_weights") && j["scale_attn_weights"] != true)
    refuse("scale_attn_weights", "true (attention scores scaled by 1/sqrt(head size), as GPT-2)");
  if (j.contains("scale_attn_by_inverse_layer_idx") &&
      j["scale_attn_by_inverse_layer_idx"] != false)
    refuse("scale_attn_by_inverse_layer_idx",
           "false (GPT-2's attention; true also divides layer i's scores by i + 1, which ditto "
           "does not compute)");
  if (j.contains("n_inner") && !j["n_inner"].is_null() &&
      !(j["n_inner"].is_number_integer() && j["n_inner"].get<std::int64_t>() == 4 * c.n_embd))
    refuse("n_inner", detail::cat("null or ", 4 * c.n_embd,
                                  " (4 x n_embd: the width of the tensors' mlp.c_fc, the only "
                                  "MLP width ditto's GPT has)"));
  const std::pair<const char*, std::int64_t> sizes[] = {{"n_layer", c.n_layer},
                                                        {"n_embd", c.n_embd},
                                                        {"n_positions", c.block_size},
                                                        {"vocab_size", c.vocab_size}};
  for (const auto& [key, tensors] : sizes)
    if (j.contains(key) && !(j[key].is_number_integer() && j[key].get<std::int64_t>() == tensors))
      refuse(key,
             detail::cat(tensors, " (the tensors' ",
                         key == std::string("n_positions") ? "block_size, wpe's rows" : key, ")"));
}

// The bytes of trainer.json `from`'s "vocab" (hex, Note [Checkpoint vocabulary]) for a model of
// `vocab_size` rows: distinct bytes, at most vocab_size of them; ParseError otherwise.
std::vector<unsigned char> parse_vocab(const std::string& from, const std::string& hex,
                                       std::int64_t vocab_size) {
  auto digit = [](char ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
  };
  std::vector<unsigned char> out;
  std::array<bool, 256> seen{};
  bool ok = hex.size() % 2 == 0 && !hex.empty();
  for (std::size_t i = 0; ok && i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    ok = hi >= 0 && lo >= 0 && !seen[static_cast<std::size_t>(hi * 16 + lo)];
    if (ok) {
      seen[static_cast<std::size_t>(hi * 16 + lo)] = true;
      out.push_back(static_cast<unsigned char>(hi * 16 + lo));
    }
  }
  if (!ok || static_cast<std::int64_t>(out.size()) > vocab_size)
    bad(from, detail::cat("config vocab: expected distinct bytes in lowercase hex, at most the "
                          "model's vocab_size = ",
                          vocab_size, " of them, got '", hex.substr(0, 64),
                          hex.size() > 64 ? "...'" : "'"));
  return out;
}

// n_head from a ditto checkpoint's trainer.json beside `path` (DIR/step-N/model.safetensors):
// its config "model" "gpt(n_layer=..,n_head=N,...)"; 0 when there is none or it is not a GPT's.
std::int64_t n_head_from_trainer_json(const std::string& path, std::string& from) {
  const fs::path tj = fs::path(path).parent_path() / "trainer.json";
  std::error_code ec;
  if (!fs::is_regular_file(tj, ec)) return 0;
  std::string text = read_file(tj.string(), kMaxJsonBytes, "io::load_gpt_weights");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("config") || !j["config"].is_object() ||
      !j["config"].contains("model") || !j["config"]["model"].is_string())
    return 0;
  const std::string model = j["config"]["model"].get<std::string>();
  static const std::regex re(R"(^gpt\(.*[(,]n_head=([0-9]+)[,)])");
  std::smatch m;
  if (!std::regex_search(model, m, re)) return 0;
  std::int64_t nh = 0;
  try {
    nh = std::stoll(m[1].str());
  } catch (const std::logic_error&) {
    return 0;
  }
  if (nh < 1) return 0;
  from = tj.string();
  return nh;
}

// The vocabulary a ditto checkpoint's trainer.json beside `path` records (Note [Checkpoint
// vocabulary]) into w.vocab and w.vocab_from, for a model of `vocab_size` rows; nothing when there
// is none, it is not a GPT's, or it has no "vocab" (a run on token files).
void vocab_from_trainer_json(const std::string& path, std::int64_t vocab_size, GptWeights& w) {
  const fs::path tj = fs::path(path).parent_path() / "trainer.json";
  std::error_code ec;
  if (!fs::is_regular_file(tj, ec)) return;
  std::string text = read_file(tj.string(), kMaxJsonBytes, "io::load_gpt_weights");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("config") || !j["config"].is_object())
    return;
  const nlohmann::json& cfg = j["config"];
  if (!cfg.contains("model") || !cfg["model"].is_string() ||
      cfg["model"].get<std::string>().rfind("gpt(", 0) != 0 || !cfg.contains("vocab") ||
      !cfg["vocab"].is_string())
    return;
  w.vocab = parse_vocab(tj.string(), cfg["vocab"].get<std::string>(), vocab_size);
  w.vocab_from = tj.string();
}

// A state_dict's name as nanoGPT reads it: torch.compile's '_orig_mod.' (nanoGPT's default,
// compile=True, saves its model's names so; its train.py strips the prefix on resume) and DDP's
// 'module.' taken off the front.
std::string without_wrapper_prefixes(std::string name) {
  for (bool again = true; again;) {
    again = false;
    for (const char* p : {"_orig_mod.", "module."})
      if (name.rfind(p, 0) == 0) name = name.substr(std::strlen(p)), again = true;
  }
  return name;
}

GptWeights from_safetensors(const std::string& path, const SafetensorsData& d,
                            std::int64_t n_head_hint) {
  // Names without the wrapper prefixes and "transformer.", the mask buffers dropped; `stored_name`:
  // each one's name in the file, which errors name.
  std::map<std::string, const Tensor*> t;
  std::map<std::string, std::string> stored_name;
  const Tensor* lm_head = nullptr;
  std::string lm_head_name;
  static const std::regex mask(R"(h\.\d+\.attn\.(bias|masked_bias))");
  auto short_name = [](const std::string& name) {
    const std::string n = without_wrapper_prefixes(name);
    return n.rfind("transformer.", 0) == 0 ? n.substr(12) : n;
  };
  for (const auto& [name, dt] : d.skipped) {  // dtypes ditto cannot hold: mask buffers only
    if (!std::regex_match(short_name(name), mask))
      bad(path, detail::cat(io::quoted_name(name), ": expected F32, BF16 or F16, got ", dt));
  }
  for (const auto& [name, tensor] : d.tensors) {
    const std::string n = short_name(name);
    if (n == "lm_head.weight") {
      lm_head = &tensor;
      lm_head_name = name;
      continue;
    }
    if (std::regex_match(n, mask)) continue;
    if (t.count(n))
      bad(path, detail::cat(io::quoted_name(name), " and ", io::quoted_name(stored_name[n]),
                            ": the same tensor twice (names compared without the "
                            "'transformer.', '_orig_mod.' and 'module.' prefixes)"));
    t[n] = &tensor;
    stored_name[n] = name;
  }
  // A few of the names the file holds, for an error that misses one.
  auto some_names = [&] {
    std::string s;
    const std::size_t shown = std::min<std::size_t>(d.tensors.size(), 4);
    for (std::size_t i = 0; i < shown; ++i)
      s += detail::cat(i ? ", " : "", io::quoted_name(d.tensors[i].first));
    if (d.tensors.size() > shown) s += detail::cat(", ... (", d.tensors.size(), " tensors)");
    return s.empty() ? std::string("no tensors") : s;
  };
  auto need = [&](const std::string& n) -> const Tensor& {
    auto it = t.find(n);
    if (it == t.end())
      bad(path, detail::cat("expected a tensor 'transformer.", n, "' (or '", n,
                            "') of GPT-2's, got none; the file holds ", some_names()));
    const DType dt = it->second->dtype();
    if (dt != DType::f32 && dt != DType::bf16 && dt != DType::f16)
      bad(path, detail::cat(io::quoted_name(stored_name.at(n)), ": expected F32, BF16 or F16, got ",
                            safetensors_dtype(dt)));
    return *it->second;
  };
  const Tensor& wte = need("wte.weight");
  const Tensor& wpe = need("wpe.weight");
  if (wte.dim() != 2 || wpe.dim() != 2 || wpe.size(1) != wte.size(1))
    bad(path, detail::cat("expected wte.weight [vocab_size, n_embd] and wpe.weight [block_size, "
                          "n_embd], got ",
                          shape_str(wte.shape()), " and ", shape_str(wpe.shape())));
  nn::GPTConfig c;
  c.vocab_size = wte.size(0);
  c.n_embd = wte.size(1);
  c.block_size = wpe.size(0);
  c.dropout = 0.0f;
  c.n_layer = 0;
  while (t.count(block_name(c.n_layer, "ln_1.weight").substr(12))) ++c.n_layer;
  if (c.n_layer == 0)
    bad(path, "expected the tensors of block 0 ('h.0.ln_1.weight', ...), got none");
  c.bias = t.count("h.0.ln_1.bias") > 0;
  const std::int64_t C = c.n_embd;
  const Tensor& qkv = need("h.0.attn.c_attn.weight");
  bool hf;
  if (qkv.shape() == Shape{C, 3 * C})
    hf = true;
  else if (qkv.shape() == Shape{3 * C, C})
    hf = false;
  else
    bad(path, detail::cat("'h.0.attn.c_attn.weight': expected [", C, ", ", 3 * C,
                          "] (Hugging Face's Conv1D) or [", 3 * C, ", ", C,
                          "] (nanoGPT's Linear) for n_embd ", C, ", got ", shape_str(qkv.shape())));
  GptWeights w;
  w.format = hf ? GptWeightsFormat::hf : GptWeightsFormat::nanogpt;
  w.description = hf ? "Hugging Face GPT-2 safetensors" : "safetensors in nanoGPT's layout";
  // n_head (Note [GPT-2 safetensors]).
  std::int64_t nh = 0;
  if (auto it = d.metadata.find("ditto.n_head"); it != d.metadata.end()) {
    try {
      std::size_t used = 0;
      nh = std::stoll(it->second, &used);
      if (used != it->second.size()) nh = 0;
    } catch (...) {
      nh = 0;
    }
    if (nh < 1)
      bad(path, detail::cat("__metadata__ ditto.n_head: expected an integer >= 1, got '",
                            it->second, "'"));
    w.n_head_from = "its __metadata__ ditto.n_head";
  }
  if (nh == 0) nh = n_head_from_trainer_json(path, w.n_head_from);
  const nlohmann::json config_json = read_config_json(path);  // Note [GPT-2 config.json]
  if (nh == 0) nh = n_head_from_config_json(path, config_json, w.n_head_from);
  if (nh == 0)
    for (const nn::GPT2Preset& p : nn::gpt2_presets())
      if (p.n_layer == c.n_layer && p.n_embd == C) {
        nh = p.n_head;
        w.n_head_from = std::string("the GPT-2 size ") + p.model_type + " (" +
                        std::to_string(p.n_layer) + " layers, n_embd " + std::to_string(C) + ")";
      }
  if (nh == 0) nh = n_head_hint;
  DITTO_CHECK(nh >= 1, "io::load_gpt_weights: '", path,
              "': the file does not record n_head "
              "(the number of attention heads): expected --n-head, a config.json beside it with "
              "\"n_head\", a ditto trainer.json beside it, or a GPT-2 size (n_layer ",
              c.n_layer, ", n_embd ", C, " is none), got none");
  c.n_head = nh;
  check_config_or_bad(path, c);
  check_config_json(path, config_json, c);  // Note [GPT-2 config.json]
  // Every name must be one of the model's.
  std::set<std::string> expected;
  for (const auto& [name, shape] : gpt_param_specs(c)) expected.insert(name.substr(12));
  for (const auto& [n, tensor] : t)
    if (!expected.count(n))
      bad(path,
          detail::cat("unknown tensor ", io::quoted_name(stored_name.at(n)), " ",
                      shape_str(tensor->shape()), ": expected GPT-2's names (wte, wpe, h.0..h.",
                      c.n_layer - 1, ", ln_f", c.bias ? ", with biases" : ", without biases", ")"));
  for (const auto& [name, shape] : gpt_param_specs(c)) {
    const std::string n = name.substr(12);
    const Tensor& src = need(n);
    bool conv = false;
    for (const BlockParam& p : block_params())
      if (hf && p.conv1d && n.size() > std::strlen(p.name) &&
          n.compare(n.size() - std::strlen(p.name), std::string::npos, p.name) == 0)
        conv = true;
    const Shape stored = conv ? Shape{shape[1], shape[0]} : shape;
    if (src.shape() != stored)
      bad(path, detail::cat(io::quoted_name(stored_name.at(n)), ": expected ", shape_str(stored),
                            conv ? " (Conv1D's [in, out])" : "", " for n_layer ", c.n_layer,
                            ", n_embd ", C, ", got ", shape_str(src.shape())));
    Tensor f = src.to(DType::f32);
    w.params.emplace_back(name, conv ? transposed(f) : f);
  }
  if (lm_head) {
    const Tensor& wte32 = w.params[0].second;
    Tensor head = lm_head->to(DType::f32);
    if (head.shape() != wte32.shape())
      bad(path,
          detail::cat(
              io::quoted_name(lm_head_name), ": expected the tied head, equal to wte.weight ",
              shape_str(wte32.shape()), " (ditto's GPT ties them, as GPT-2), got the shape ",
              shape_str(lm_head->shape()),
              head.dim() == 2 && head.size(0) == wte32.size(1) && head.size(1) == wte32.size(0)
                  ? " (transposed)"
                  : ""));
    if (std::memcmp(head.data_ptr(), wte32.data_ptr(), wte32.nbytes()) != 0)
      bad(path, detail::cat(io::quoted_name(lm_head_name), " ", shape_str(lm_head->shape()),
                            ": expected the "
                            "tied head, equal to wte.weight (ditto's GPT ties them, as GPT-2), "
                            "got other values"));
  }
  w.config = c;
  w.padded_vocab_size = c.vocab_size;
  vocab_from_trainer_json(path, c.vocab_size, w);  // Note [Checkpoint vocabulary]
  return w;
}

// ---- ditto checkpoint ---------------------------------------------------------------------------

GptWeights from_checkpoint(const std::string& path) {
  std::error_code ec;
  const bool step_dir = fs::is_regular_file(fs::path(path) / "trainer.json", ec);
  Checkpoint ck = step_dir ? read_checkpoint(path) : read_latest_checkpoint(path, std::cerr);
  const std::string model = ck.state.config.count("model") ? ck.state.config.at("model") : "";
  if (model.rfind("gpt(", 0) != 0)
    bad(ck.path, detail::cat("expected a checkpoint of a GPT (ditto-train --model gpt), got one "
                             "of model '",
                             model, "'"));
  auto field = [&](const char* key) -> std::string {
    const std::regex re(std::string("[(,]") + key + "=([^,)]*)");
    std::smatch m;
    if (!std::regex_search(model, m, re))
      bad(ck.path, detail::cat("trainer.json's model '", model, "': expected a field ", key));
    return m[1].str();
  };
  nn::GPTConfig c;
  try {
    c.n_layer = std::stoll(field("n_layer"));
    c.n_head = std::stoll(field("n_head"));
    c.n_embd = std::stoll(field("n_embd"));
    c.block_size = std::stoll(field("block_size"));
    c.vocab_size = std::stoll(field("vocab_size"));
  } catch (const std::logic_error&) {
    bad(ck.path, detail::cat("trainer.json's model '", model, "': expected integer sizes"));
  }
  c.bias = field("bias") == "True";
  c.dropout = 0.0f;
  check_config_or_bad(ck.path, c);
  GptWeights w;
  w.format = GptWeightsFormat::checkpoint;
  w.description = "ditto checkpoint " + ck.path;
  w.n_head_from = "the checkpoint";
  w.config = c;
  w.padded_vocab_size = c.vocab_size;
  if (auto it = ck.state.config.find("vocab"); it != ck.state.config.end()) {
    w.vocab_from = (fs::path(ck.path) / "trainer.json").string();
    w.vocab = parse_vocab(w.vocab_from, it->second, c.vocab_size);  // Note [Checkpoint vocabulary]
  }
  std::map<std::string, Tensor> by = host_by_name(ck.params);
  for (const auto& [name, shape] : gpt_param_specs(c)) {
    auto it = by.find(name);
    if (it == by.end()) bad(ck.path, detail::cat("expected a parameter '", name, "', got none"));
    if (it->second.shape() != shape)
      bad(ck.path, detail::cat("'", name, "': expected ", shape_str(shape), ", got ",
                               shape_str(it->second.shape())));
    w.params.emplace_back(name, it->second);
    by.erase(it);
  }
  if (!by.empty())
    bad(ck.path, detail::cat("unknown parameter '", by.begin()->first, "' for ", model));
  return w;
}

}  // namespace

std::vector<std::pair<std::string, Shape>> gpt_param_specs(const nn::GPTConfig& cfg) {
  try {
    nn::check_config(cfg);  // (n_layer -1 gave the specs of no block)
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::cat("io::gpt_param_specs: ", e.what()));
  }
  const std::int64_t C = cfg.n_embd;
  std::vector<std::pair<std::string, Shape>> out{{"transformer.wte.weight", {cfg.vocab_size, C}},
                                                 {"transformer.wpe.weight", {cfg.block_size, C}}};
  for (std::int64_t l = 0; l < cfg.n_layer; ++l)
    for (const BlockParam& p : block_params())
      if (cfg.bias || !p.is_bias) out.emplace_back(block_name(l, p.name), block_shape(p, C));
  out.emplace_back("transformer.ln_f.weight", Shape{C});
  if (cfg.bias) out.emplace_back("transformer.ln_f.bias", Shape{C});
  return out;
}

namespace {

// The index of the first NaN or infinity of host f32 `t`, or -1. A pass over each block's exponent
// bits that the compiler vectorises (a few percent of reading GPT-2 124M's file), then a search
// only in a block that has one.
std::int64_t first_non_finite(const Tensor& t) {
  const std::int64_t n = t.numel();
  const float* f = t.data<float>();
  constexpr std::int64_t kBlock = 4096;
  for (std::int64_t b = 0; b < n; b += kBlock) {
    const std::int64_t e = std::min(n, b + kBlock);
    std::uint32_t any = 0;
    for (std::int64_t i = b; i < e; ++i) {
      std::uint32_t u;
      std::memcpy(&u, f + i, sizeof u);
      any |= static_cast<std::uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    }
    if (any)
      for (std::int64_t i = b; i < e; ++i)
        if (!std::isfinite(f[i])) return i;
  }
  return -1;
}

// Refuses weights with a NaN or an infinity (ParseError naming `path`, the parameter by nanoGPT's
// state_dict key, the element's index in nanoGPT's layout and its value): training from them
// would give NaN losses from the first step, far from their cause. Returns `w`.
GptWeights finite(const std::string& path, GptWeights w) {
  for (const auto& [name, t] : w.params) {
    const std::int64_t i = first_non_finite(t);
    if (i < 0) continue;
    std::string at;
    std::int64_t rest = i;
    for (std::int64_t d = t.dim() - 1; d >= 0; --d) {
      const std::int64_t size = t.size(d);
      at = detail::cat(rest % size, at.empty() ? "" : ", ", at);
      rest /= size;
    }
    const float v = t.data<float>()[i];
    bad(path, detail::cat("'", name, "' [", at, "] is ",
                          std::isnan(v) ? "nan"
                          : v > 0       ? "inf"
                                        : "-inf",
                          ": expected finite weights (the parameter by nanoGPT's state_dict key, "
                          "the index of its first non-finite element in nanoGPT's layout)"));
  }
  return w;
}

// Whether directory `dir` is a ditto checkpoint directory (DIR: latest, lock or step-N entries)
// or one checkpoint (DIR/step-N: trainer.json), not some other folder.
bool is_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  for (const char* marker : {"latest", "lock", "trainer.json"})
    if (fs::exists(dir / marker, ec)) return true;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind("step-", 0) == 0) return true;
  return false;
}

}  // namespace

GptWeights load_gpt_weights(const std::string& path, std::int64_t n_head_hint) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (is_checkpoint_dir(path)) return finite(path, from_checkpoint(path));
    // A Hugging Face download folder (model.safetensors, config.json, ...): its model file.
    const fs::path st = fs::path(path) / "model.safetensors";
    if (fs::is_regular_file(st, ec)) return load_gpt_weights(st.string(), n_head_hint);
    const std::string torch = pytorch_file_hint((fs::path(path) / "ckpt.pt").string());
    bad(path, detail::cat("expected a ditto checkpoint directory (DIR/latest, DIR/step-N) or a "
                          "folder with a model.safetensors (Hugging Face's), got a folder with "
                          "neither",
                          torch.empty() ? std::string(": pass the model file itself "
                                                      "(DIR/model.safetensors, an llm.c .bin)")
                                        : " (nanoGPT's out_dir): " + torch));
  }
  // nanoGPT's ckpt.pt (torch.save): named as such, not read as a safetensors header.
  if (const std::string torch = pytorch_file_hint(path); !torch.empty())
    throw ParseError(detail::cat("io::load_gpt_weights: ", torch));
  try {
    InputFile in(path, std::numeric_limits<std::uint64_t>::max(), "io::load_gpt_weights");
    std::string first;
    if (in.size() >= 4) in.read(first, 4);
    std::int32_t magic = 0;
    if (first.size() == 4) std::memcpy(&magic, first.data(), 4);
    if (magic == kLlmcModelMagic) return finite(path, load_llmc(path));
  } catch (const ParseError&) {
    throw;
  } catch (const InvalidArgument&) {
    throw;
  } catch (const Error& e) {
    throw ParseError(e.what());
  }
  SafetensorsData d;
  try {
    SafetensorsReadOptions o;
    o.skip_unheld_dtypes = true;  // BOOL attention-mask buffers of some GPT-2 files
    d = load_safetensors(path, o);
  } catch (const ParseError& e) {
    throw ParseError(detail::cat("io::load_gpt_weights: '", path,
                                 "': expected an llm.c model "
                                 "file (int32 magic 20240326 first), a safetensors file or a "
                                 "checkpoint directory; as safetensors: ",
                                 e.what()));
  }
  return finite(path, from_safetensors(path, d, n_head_hint));
}

void load_gpt_params(nn::Module& model, const GptWeights& w) {
  std::map<std::string, const Tensor*> by;
  for (const auto& [n, t] : w.params) by[n] = &t;
  std::vector<nn::Parameter*> ps = model.parameters();
  DITTO_CHECK(ps.size() == w.params.size(), "io::load_gpt_params: expected a model of ",
              w.params.size(), " parameters (the file's), got ", ps.size());
  for (nn::Parameter* p : ps) {
    auto it = by.find(p->name);
    DITTO_CHECK(it != by.end(), "io::load_gpt_params: parameter '", p->name,
                "': expected it in the file's parameters, got none");
    DITTO_CHECK(it->second->shape() == p->data.shape(), "io::load_gpt_params: parameter '", p->name,
                "': expected ", shape_str(p->data.shape()), ", the file has ",
                shape_str(it->second->shape()));
    p->data.copy_(it->second->to(p->data.dtype()));
  }
}

Named gpt_params_f32(nn::Module& model) {
  Named out;
  for (nn::Parameter* p : model.parameters())
    out.emplace_back(p->name, p->data.to(Device::cpu(), DType::f32));
  return out;
}

std::string llmc_model_serialize(const nn::GPTConfig& cfg, const Named& params, DType dtype) {
  DITTO_CHECK(dtype == DType::f32 || dtype == DType::bf16,
              "io::llmc_model_serialize: dtype: "
              "expected f32 or bf16, got ",
              dtype_name(dtype));
  DITTO_CHECK(cfg.bias, "io::llmc_model_serialize: expected a GPT with biases (llm.c's GPT-2 has "
                        "every bias: --bias), got bias=False");
  check_params(cfg, params, "io::llmc_model_serialize");
  const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, Vp = (V + 127) / 128 * 128;
  DITTO_CHECK(Vp <= std::numeric_limits<std::int32_t>::max() &&
                  cfg.block_size <= std::numeric_limits<std::int32_t>::max() &&
                  C <= std::numeric_limits<std::int32_t>::max(),
              "io::llmc_model_serialize: expected sizes that fit llm.c's int32 header");
  std::int32_t h[256] = {};
  h[0] = kLlmcModelMagic;
  h[1] = dtype == DType::f32 ? kLlmcVersionF32 : kLlmcVersionBf16;
  h[2] = static_cast<std::int32_t>(cfg.block_size);
  h[3] = static_cast<std::int32_t>(V);
  h[4] = static_cast<std::int32_t>(cfg.n_layer);
  h[5] = static_cast<std::int32_t>(cfg.n_head);
  h[6] = static_cast<std::int32_t>(C);
  h[7] = static_cast<std::int32_t>(Vp);
  std::string out(reinterpret_cast<const char*>(h), sizeof h);
  const std::size_t elem = dtype_size(dtype);
  std::map<std::string, Tensor> by = host_by_name(params);
  auto put = [&](const Tensor& f32, std::int64_t pad_elems = 0) {
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(f32.numel() + pad_elems) * elem, '\0');
    detail::cast_on_host(f32.data_ptr(), DType::f32, out.data() + at, dtype, f32.numel());
  };
  put(by.at("transformer.wte.weight"), (Vp - V) * C);
  put(by.at("transformer.wpe.weight"));
  for (const BlockParam& p : block_params())
    for (std::int64_t l = 0; l < cfg.n_layer; ++l) put(by.at(block_name(l, p.name)));
  put(by.at("transformer.ln_f.weight"));
  put(by.at("transformer.ln_f.bias"));
  return out;
}

Named hf_gpt2_tensors(const nn::GPTConfig& cfg, const Named& params) {
  DITTO_CHECK(cfg.bias, "io::hf_gpt2_tensors: expected a GPT with biases (GPT-2 has every bias: "
                        "--bias), got bias=False");
  check_params(cfg, params, "io::hf_gpt2_tensors");
  std::map<std::string, Tensor> by = host_by_name(params);
  Named out;
  for (const auto& [name, shape] : gpt_param_specs(cfg)) {
    bool conv = false;
    for (const BlockParam& p : block_params())
      if (p.conv1d && name.size() > std::strlen(p.name) &&
          name.compare(name.size() - std::strlen(p.name), std::string::npos, p.name) == 0)
        conv = true;
    out.emplace_back(name, conv ? transposed(by.at(name)) : by.at(name));
  }
  return out;
}

void save_llmc_model(const std::string& path, const nn::GPTConfig& cfg, const Named& params,
                     DType dtype) {
  write_file_atomic(path, llmc_model_serialize(cfg, params, dtype));
}

void save_hf_gpt2(const std::string& path, const nn::GPTConfig& cfg, const Named& params) {
  save_safetensors(path, hf_gpt2_tensors(cfg, params),
                   {{"format", "pt"}, {"ditto.n_head", std::to_string(cfg.n_head)}});
}

}  // namespace ditto::io
