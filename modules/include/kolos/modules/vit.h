// ViT (Dosovitskiy et al. 2021): an image cut into square patches, each
// flattened and projected by a linear layer, a learned class token and
// learned positions, pre-LN transformer blocks with bidirectional
// attention and a GELU MLP, a final LayerNorm and a classification head on
// the class token, cross-entropy over model.classes. Written once against
// LayerFactory, as a list of blocks: "embed", "h.0" .. "h.{L-1}", "head".
//
// Its input is the engine's int64 sample (kolos/core/data_source.h): an
// image source fills a sample's first seq_len = image_size^2 * channels
// values with the bits of the normalised float32 pixels (H x W x C order,
// each int32 bit pattern sign-extended: data::pack_pixel in
// kolos/modules/data.h) and its last value
// with the label; the engine's targets are the sample shifted by one, so the
// label is the targets' last column and the loss reads only that.
#pragma once

#include <memory>

#include "kolos/core/model.h"

namespace kolos::modules {

std::shared_ptr<Model> build_vit(const ModelConfig& config, LayerFactory& factory);

}  // namespace kolos::modules
