#include "model/model_source.h"

#include <nlohmann/json.hpp>

#include "io/json_file.h"
#include "io/mapped_file.h"
#include "model/weight_binder.h"

namespace moetier {

namespace {

// The dtype of the experts: that of the tensor holding the first MoE layer's first gate matrix.
Expected<DType> HfExpertDtype(const ModelSource& s) {
  for (int64_t l = 0; l < s.config.n_layers; ++l) {
    if (!s.config.layer_is_moe[static_cast<size_t>(l)]) continue;
    const std::string name = s.spec->expert_tensor_name(l, 0, ExpertMatrix::kGate);
    const TensorView* v = s.hf->Find(name);
    if (v == nullptr)
      return Status::Error(s.hf->description() + ": missing tensor '" + name + "', which " +
                           s.config.architecture + " needs");
    if (!IsWeightDType(v->dtype))
      return Status::Error(s.hf->FileOf(name) + ": tensor '" + name + "' has dtype " +
                           std::string(DTypeName(v->dtype)) + "; weights must be BF16, F16 or F32");
    return v->dtype;
  }
  return s.config.declared_dtype.value_or(DType::kBF16);
}

// The converted index must describe the model config.json describes.
Status CheckIndexAgainstConfig(const ModelSource& s) {
  const BankIndex& idx = s.converted->index();
  const std::string& where = s.converted->description();
  const ModelConfig& c = s.config;
  if (idx.architecture != c.architecture)
    return Status::Error(where + ": architecture '" + idx.architecture + "' contradicts " +
                         c.source + " ('" + c.architecture + "')");
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (c.layer_is_moe[static_cast<size_t>(l)]) moe_layers.push_back(l);
  if (idx.banks.size() != moe_layers.size())
    return Status::Error(where + ": " + std::to_string(idx.banks.size()) + " expert banks but " +
                         c.source + " describes " + std::to_string(moe_layers.size()) +
                         " MoE layers");
  for (size_t i = 0; i < idx.banks.size(); ++i) {
    const BankIndexBank& b = idx.banks[i];
    const std::string bank = "bank of layer " + std::to_string(b.layer);
    auto mismatch = [&](const char* what, int64_t have, const char* key, int64_t want) {
      return Status::Error(where + ": " + bank + " has " + what + " " + std::to_string(have) +
                           " but " + c.source + " says " + key + " = " + std::to_string(want));
    };
    if (b.layer != moe_layers[i])
      return Status::Error(where + ": " + bank + " is not a MoE layer of " + c.source +
                           " (expected layer " + std::to_string(moe_layers[i]) + ")");
    if (b.n_experts != c.n_experts)
      return mismatch("n_experts", b.n_experts, "the expert count", c.n_experts);
    if (b.width != c.expert_intermediate_size)
      return mismatch("width", b.width, "the expert width", c.expert_intermediate_size);
    if (b.d_model != c.hidden_size)
      return mismatch("d_model", b.d_model, "hidden_size", c.hidden_size);
    if (b.dtype != idx.banks[0].dtype)
      return Status::Error(where + ": " + bank + " has dtype " + std::string(DTypeName(b.dtype)) +
                           " unlike the first bank");
    // config.json is copied unchanged by convert, so it declares the checkpoint's dtype; a
    // bank may differ from it only as the index's expert_dtype says convert chose.
    if (c.declared_dtype && b.dtype != *c.declared_dtype &&
        !(idx.expert_dtype && b.dtype == *idx.expert_dtype))
      return Status::Error(where + ": " + bank + " is " + std::string(DTypeName(b.dtype)) +
                           " but " + c.source + " declares " +
                           std::string(DTypeName(*c.declared_dtype)));
    const ExpertLayout layout{c.hidden_size, c.expert_intermediate_size, b.dtype};
    if (b.expert_stride_bytes != layout.stride_bytes())
      return Status::Error(where + ": " + bank + " has expert_stride_bytes " +
                           std::to_string(b.expert_stride_bytes) + ", expected " +
                           std::to_string(layout.stride_bytes()) + "; re-run moetier convert");
  }
  return OkStatus();
}

// `dir` must be a directory: a symlink loop or an unreadable path is an error, not an exception.
Status CheckModelDirectory(const std::filesystem::path& dir) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(dir, ec);
  if (ec && st.type() != std::filesystem::file_type::not_found)
    return Status::Error(dir.string() + ": cannot open: " + ec.message() +
                         "; --model takes a model directory");
  if (st.type() != std::filesystem::file_type::directory)
    return Status::Error(dir.string() + ": not a directory; --model takes a model directory");
  return OkStatus();
}

// config.json's text and the architecture it names.
struct ConfigFile {
  std::string path;
  std::string text;
  std::string architecture;
};

Expected<ConfigFile> ReadConfigFile(const std::filesystem::path& dir) {
  MT_RETURN_IF_ERROR(CheckModelDirectory(dir));
  ConfigFile f;
  f.path = (dir / "config.json").string();
  MT_ASSIGN_OR_RETURN(f.text, ReadTextFile(f.path));
  MT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonText(f.text, f.path));
  MT_ASSIGN_OR_RETURN(f.architecture, ReadArchitectureName(j, f.path));
  return f;
}

// Opens the weight files of `dir` as `spec` describes them, and sizes each MoE layer's bank.
Expected<ModelSource> OpenWithSpec(const std::filesystem::path& dir, const ConfigFile& config,
                                   const arch::ArchSpec& spec) {
  ModelSource s;
  s.dir = dir;
  s.spec = &spec;
  MT_ASSIGN_OR_RETURN(s.config, ParseModelConfig(config.text, config.path, spec.parse_config));
  DType expert_dtype;
  if (IsConvertedModelDir(dir)) {
    MT_ASSIGN_OR_RETURN(ConvertedModel m, ConvertedModel::Open(dir));
    s.converted = std::make_unique<ConvertedModel>(std::move(m));
    MT_RETURN_IF_ERROR(CheckIndexAgainstConfig(s));
    s.config.converted_dense_dtype = s.converted->index().dense_dtype;
    expert_dtype =
        s.converted->index().banks.empty() ? DType::kBF16 : s.converted->index().banks[0].dtype;
  } else {
    MT_ASSIGN_OR_RETURN(Checkpoint c, Checkpoint::OpenHfDirectory(dir));
    s.hf = std::make_unique<Checkpoint>(std::move(c));
    MT_ASSIGN_OR_RETURN(expert_dtype, HfExpertDtype(s));
  }
  s.layout = ExpertLayout{s.config.hidden_size, s.config.expert_intermediate_size, expert_dtype};
  for (int64_t l = 0; l < s.config.n_layers; ++l)
    if (s.config.layer_is_moe[static_cast<size_t>(l)])
      s.banks.push_back({l, s.layout.bank_bytes(s.config.n_experts), expert_dtype});
  return s;
}

}  // namespace

std::set<std::string> ExpertTensorNames(const ModelSource& s) {
  std::set<std::string> names;
  for (const auto& b : s.banks)
    for (int64_t e = 0; e < s.config.n_experts; ++e)
      for (ExpertMatrix m : {ExpertMatrix::kGate, ExpertMatrix::kUp, ExpertMatrix::kDown})
        names.insert(s.spec->expert_tensor_name(b.layer, e, m));
  return names;
}

std::set<std::string> RouterTensorNames(const ModelSource& s) {
  std::set<std::string> names;
  for (const auto& b : s.banks) names.insert(s.spec->router_tensor_name(b.layer));
  return names;
}

Expected<std::vector<ExpertWeights>> CheckpointExperts(const ModelSource& s, int64_t layer) {
  const ExpertLayout& lay = s.layout;
  const int64_t E = s.config.n_experts;
  WeightBinder b(*s.hf, s.config);
  auto bind = [&](int64_t e, ExpertMatrix m, int64_t rows, int64_t cols) {
    return b.Expert(s.spec->expert_tensor(layer, e, m), {rows, cols}, E);
  };
  std::vector<ExpertWeights> src(static_cast<size_t>(E));
  for (int64_t e = 0; e < E && b.status().ok(); ++e) {
    auto& w = src[static_cast<size_t>(e)];
    w.gate = bind(e, ExpertMatrix::kGate, lay.width, lay.d_model);
    w.up = bind(e, ExpertMatrix::kUp, lay.width, lay.d_model);
    w.down = bind(e, ExpertMatrix::kDown, lay.d_model, lay.width);
    for (const TensorView* v : {&w.gate, &w.up, &w.down})
      if (b.status().ok() && v->dtype != lay.dtype)
        return Status::Error(s.hf->description() + ": layer " + std::to_string(layer) + " expert " +
                             std::to_string(e) + " is " + std::string(DTypeName(v->dtype)) +
                             " but the other experts are " + std::string(DTypeName(lay.dtype)));
  }
  MT_RETURN_IF_ERROR(b.status());
  return src;
}

std::unique_ptr<TensorStore> ModelSource::TakeDense() {
  if (hf) return std::move(hf);
  return std::move(converted);
}

Expected<ModelSource> OpenModelSource(const std::filesystem::path& dir) {
  MT_ASSIGN_OR_RETURN(const ConfigFile config, ReadConfigFile(dir));
  const arch::ArchSpec* spec = arch::FindArch(config.architecture);
  if (spec == nullptr)
    return Status::Error(config.path + ": unknown architecture '" + config.architecture +
                         "'; supported: " + arch::SupportedArchNames());
  return OpenWithSpec(dir, config, *spec);
}

Expected<ModelSource> OpenModelSourceAs(const std::filesystem::path& dir,
                                        const arch::ArchSpec& spec) {
  MT_ASSIGN_OR_RETURN(const ConfigFile config, ReadConfigFile(dir));
  if (config.architecture != spec.hf_name)
    return Status::Error(config.path + ": architecture '" + config.architecture +
                         "', but the model is opened as " + std::string(spec.hf_name));
  return OpenWithSpec(dir, config, spec);
}

}  // namespace moetier
