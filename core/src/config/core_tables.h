// The core sections' settings tables (core_tables.cpp): the model's (one
// per model family: gpt, llama, mixtral, vit, dit, and the rows written
// back for each), [data], [optim], [train], [log], [checkpoint], [runtime]
// and [parallel]'s own keys. Private to core/src/config.
#pragma once

#include <string>
#include <vector>

#include "kolos/core/run_config.h"
#include "kolos/core/settings.h"

namespace kolos {

// The model keys each family adds to gpt's (model_table): llama's (mixtral
// has them too), mixtral's, vit's required and optional ones, dit's.
extern const std::vector<std::string> kLlamaKeys;
extern const std::vector<std::string> kMoeKeys;
extern const std::vector<std::string> kVitKeys;
extern const std::vector<std::string> kVitOptionalKeys;
extern const std::vector<std::string> kDitKeys;
// The keys only data.kind = "images" has.
extern const std::vector<std::string> kImageDataKeys;

const SettingsTable<ModelConfig>& model_table();
const SettingsTable<ModelConfig>& llama_table();
const SettingsTable<ModelConfig>& moe_table();
const SettingsTable<ModelConfig>& llama_written_table();
const SettingsTable<ModelConfig>& vit_table();
const SettingsTable<ModelConfig>& vit_optional_table();
const SettingsTable<ModelConfig>& vit_written_table();
const SettingsTable<ModelConfig>& dit_table();
const SettingsTable<DataConfig>& image_data_table();
const SettingsTable<DataConfig>& data_table();
const SettingsTable<OptimConfig>& optim_table();
const SettingsTable<TrainConfig>& train_table();
const SettingsTable<TrainConfig>& loss_scale_table();
const SettingsTable<LogConfig>& log_table();
const SettingsTable<CheckpointConfig>& checkpoint_table();
const SettingsTable<RuntimeConfig>& runtime_table();
const SettingsTable<ParallelConfig>& parallel_table();

}  // namespace kolos
