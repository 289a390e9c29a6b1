// Constructors of the concrete models behind make_model (config already validated there).
#pragma once
#include <memory>

#include "models/model.hpp"

namespace lbbsp::models {

// A stack of dense layers with ReLU between them; with no hidden widths it is multinomial logistic
// regression.
std::unique_ptr<Model> make_mlp(const ModelConfig& cfg, std::string name);
// conv5x5(16)-ReLU-maxpool2, conv5x5(32)-ReLU-maxpool2, fc to classes; needs height and width divisible by 4.
std::unique_ptr<Model> make_cnn(const ModelConfig& cfg);

}  // namespace lbbsp::models
