#include "model_checks.h"

#include "kolos/core/error.h"

namespace kolos::modules {

void check_heads(const ModelConfig& c) {
  KOLOS_CHECK_KIND(kConfig, c.hidden % c.heads == 0, "model.hidden = ", c.hidden,
                   " is not divisible by model.heads = ", c.heads);
}

void check_image_model(const ModelConfig& c, const std::string& model) {
  check_heads(c);
  KOLOS_CHECK_KIND(kConfig, c.image_size > 0 && c.patch_size > 0 && c.channels > 0 && c.classes > 1,
                   "model.name = \"", model,
                   "\" needs model.image_size, patch_size, channels and classes");
  KOLOS_CHECK_KIND(kConfig, c.image_size % c.patch_size == 0, "model.image_size = ", c.image_size,
                   " is not divisible by model.patch_size = ", c.patch_size);
}

}  // namespace kolos::modules
