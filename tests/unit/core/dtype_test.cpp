// The dtype table (kolos/core/dtype.h, and its LibTorch side dtype_torch.h):
// one row per dtype, consistent with LibTorch's own sizes, found by
// ScalarType, by name and by safetensors tag.
#include "kolos/core/dtype_torch.h"

#include <c10/core/ScalarType.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace kolos {
namespace {

const at::ScalarType kHandled[] = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong,
                                   at::kInt,   at::kByte,   at::kChar,     at::kBool};

TEST(DtypeTable, EveryHandledTypeHasOneRowWithLibTorchsSize) {
  std::set<std::string> names, tags;
  for (at::ScalarType type : kHandled) {
    const DtypeInfo* d = find_dtype(type);
    ASSERT_NE(d, nullptr) << c10::toString(type);
    EXPECT_EQ(scalar_type(*d), type);
    EXPECT_EQ(find_dtype_by_safetensors(d->safetensors), d) << d->name;
    EXPECT_EQ(d->size, static_cast<int64_t>(c10::elementSize(type))) << d->name;
    EXPECT_EQ(find_dtype(std::string(d->name)), d) << d->name;
    EXPECT_EQ(dtype_name(type), d->name);
    names.insert(d->name);
    tags.insert(d->safetensors);
  }
  EXPECT_EQ(names.size(), std::size(kHandled)) << "names must be unique";
  EXPECT_EQ(tags.size(), std::size(kHandled)) << "safetensors tags must be unique";
}

TEST(DtypeTable, NamesAndTagsAreTheFileFormatsOnes) {
  // The names are written into checkpoints (kolos.dtype) and the tags into
  // safetensors headers: they are file formats, not free to change.
  EXPECT_STREQ(find_dtype(at::kFloat)->name, "float32");
  EXPECT_STREQ(find_dtype(at::kBFloat16)->name, "bfloat16");
  EXPECT_STREQ(find_dtype(at::kHalf)->name, "float16");
  EXPECT_STREQ(find_dtype(at::kFloat)->safetensors, "F32");
  EXPECT_STREQ(find_dtype(at::kBFloat16)->safetensors, "BF16");
  EXPECT_STREQ(find_dtype(at::kLong)->safetensors, "I64");
  EXPECT_STREQ(find_dtype(at::kBool)->safetensors, "BOOL");
}

TEST(DtypeTable, UnknownTypesAndNamesAreNotFound) {
  EXPECT_EQ(find_dtype(at::kComplexFloat), nullptr);
  EXPECT_EQ(find_dtype(std::string("complex64")), nullptr);
  EXPECT_EQ(find_dtype(std::string("")), nullptr);
  EXPECT_EQ(find_dtype_by_safetensors("C64"), nullptr);
  EXPECT_EQ(dtype_name(at::kComplexFloat), "ComplexFloat");
  EXPECT_EQ(dtype_names().rfind("float32, ", 0), 0u) << dtype_names();
}

}  // namespace
}  // namespace kolos
