// Finalists, uncertainty and feedback (tune.h, docs/planner.md "Finalists").
#include "kolos/planner/tune.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "kolos/core/error.h"
#include "kolos/core/plugin_terms.h"

namespace kolos::planner {

std::string family_of(const Candidate& c) {
  std::string out = "tp=";
  out += c.tp > 1 ? c.tp_mode : "none";
  out += " sp=";
  out += c.sp_mode.empty() ? "none" : c.sp_mode;
  out += " zero=" + std::to_string(c.zero);
  out += " pp=";
  out += c.pp > 1 ? to_string(c.schedule) : "none";
  return out;
}

std::string zero_sibling(const Candidate& c) {
  Candidate d = c;
  d.zero = 0;
  // The stage's word in the description ("zero0") marks the stage left out.
  std::string out = d.describe();
  const size_t at = out.find(" zero0");
  if (at != std::string::npos) out.replace(at, 6, " zero*");
  return out;
}

namespace {

// "none" and the words of every registered plugin of `role` that offers
// layouts (PluginTerms::mode).
std::vector<std::string> modes_of(const std::string& role) {
  std::vector<std::string> out = {"none"};
  for (const std::string& name : plugin_terms_names()) {
    const PluginTerms* t = plugin_terms(name);
    if (t->role == role && t->layouts != nullptr) out.push_back(t->mode);
  }
  return out;
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

}  // namespace

bool valid_family(const std::string& text, std::string* why) {
  // Every family family_of can write, enumerated: the file's check and its
  // error message come from the same lists.
  static const std::vector<std::string> tp = modes_of("layers");
  static const std::vector<std::string> sp = modes_of("sequence");
  static const std::vector<std::string> pp = {
      "none", to_string(Schedule::kGPipe), to_string(Schedule::k1F1B),
      to_string(Schedule::kInterleaved), to_string(Schedule::kZeroBubble)};
  std::istringstream in(text);
  std::string parts[4], extra;
  in >> parts[0] >> parts[1] >> parts[2] >> parts[3];
  const auto value = [&](const std::string& part, const std::string& key,
                         const std::vector<std::string>& valid) {
    if (part.rfind(key + "=", 0) != 0) return false;
    const std::string v = part.substr(key.size() + 1);
    return std::find(valid.begin(), valid.end(), v) != valid.end();
  };
  const bool ok = !(in >> extra) && value(parts[0], "tp", tp) && value(parts[1], "sp", sp) &&
                  value(parts[2], "zero", {"0", "1", "2", "3"}) && value(parts[3], "pp", pp);
  if (!ok && why != nullptr) {
    *why = "\"" + text +
           "\" is not a plan family; expected \"tp=T sp=S zero=Z pp=P\" with T one of " +
           joined(tp) + "; S one of " + joined(sp) + "; Z 0-3; P one of " + joined(pp);
  }
  return ok;
}

double feedback_factor(const MachineRates& rates, const std::string& family) {
  const auto it = rates.feedback.find(family);
  if (it == rates.feedback.end() || it->second.empty()) return 1.0;
  double sum = 0;
  for (const double r : it->second) sum += std::log(r);
  // (sum / n) * n / (n + kFeedbackPrior): the mean log weighed by its number.
  return std::exp(sum / (static_cast<double>(it->second.size()) + kFeedbackPrior));
}

double uncertainty(const MachineRates& rates, const std::string& family) {
  const double floor = std::max(kMinSpread, rates.spread);
  // Per family: the mean of its ln ratios and the squares about it.
  double within = 0, misses = 0;
  int64_t within_n = 0, families = 0;
  for (const auto& [f, ratios] : rates.feedback) {
    if (ratios.empty()) continue;
    double mean = 0;
    for (const double x : ratios) mean += std::log(x);
    mean /= static_cast<double>(ratios.size());
    misses += mean * mean, ++families;
    for (const double x : ratios) within += (std::log(x) - mean) * (std::log(x) - mean);
    within_n += static_cast<int64_t>(ratios.size()) - 1;
  }
  const auto it = rates.feedback.find(family);
  if (it == rates.feedback.end() || it->second.empty()) {
    // Uncorrected: how far the model missed the families measured here.
    return families > 0 ? std::max(floor, std::sqrt(misses / static_cast<double>(families)))
                        : floor;
  }
  // Corrected by its own ratios: what is left is their scatter, this
  // family's when it has two or more, else every family's pooled.
  const std::vector<double>& r = it->second;
  double sigma = floor;
  if (within_n > 0) sigma = std::max(sigma, std::sqrt(within / static_cast<double>(within_n)));
  if (r.size() >= 2) {
    double mean = 0, sq = 0;
    for (const double x : r) mean += std::log(x);
    mean /= static_cast<double>(r.size());
    for (const double x : r) sq += (std::log(x) - mean) * (std::log(x) - mean);
    sigma = std::max(floor, std::sqrt(sq / static_cast<double>(r.size() - 1)));
  }
  return sigma;
}

std::vector<double> relative_to_median(const std::vector<double>& ratios) {
  if (ratios.size() < 2) return {};
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 == 1 ? sorted[n / 2] : std::sqrt(sorted[n / 2 - 1] * sorted[n / 2]);
  std::vector<double> out;
  out.reserve(n);
  for (const double r : ratios) out.push_back(r / median);
  return out;
}

void add_feedback(MachineRates& rates, const std::string& family, double ratio) {
  std::string why;
  if (!valid_family(family, &why)) throw ConfigError("feedback: " + why);
  if (!std::isfinite(ratio) || ratio <= 0) {
    throw ConfigError("feedback for \"" + family + "\": the ratio " + std::to_string(ratio) +
                      " is not a positive number");
  }
  std::vector<double>& r = rates.feedback[family];
  r.push_back(ratio);
  if (r.size() > kFeedbackKept) r.erase(r.begin(), r.end() - kFeedbackKept);
}

double margin_of(const Predicted& best, const Predicted& plan, double sigmas) {
  return std::exp(sigmas * std::hypot(best.uncertainty, plan.uncertainty)) - 1;
}

std::vector<size_t> select_finalists(const std::vector<Predicted>& plans, int64_t k,
                                     double sigmas) {
  KOLOS_CHECK(k >= 1, "select_finalists: k must be >= 1, got " + std::to_string(k));
  std::vector<size_t> out;
  if (plans.empty()) return out;
  // The best prediction (the search's order may put a plan within 1% first
  // for fewer node-crossing groups).
  size_t best = 0;
  for (size_t i = 1; i < plans.size(); ++i) {
    if (plans[i].step < plans[best].step) best = i;
  }
  std::vector<size_t> chosen;
  for (size_t i = 0; i < plans.size(); ++i) {
    const bool top = static_cast<int64_t>(i) < k;
    const bool within =
        plans[i].step <= plans[best].step * (1 + margin_of(plans[best], plans[i], sigmas));
    if (top || within) chosen.push_back(i);
  }
  // The order of the trials: the best, its ZeRO siblings, the first plain
  // data-parallel plan, the first of each other layout, the rest.
  std::vector<bool> placed(plans.size(), false);
  std::set<std::string> layouts;
  const auto place = [&](size_t i) {
    out.push_back(i);
    placed[i] = true;
    layouts.insert(plans[i].layout);
  };
  place(best);
  if (!plans[best].sibling.empty()) {
    for (const size_t i : chosen) {
      if (!placed[i] && plans[i].sibling == plans[best].sibling) place(i);
    }
  }
  for (const size_t i : chosen) {
    if (!placed[i] && plans[i].data_parallel) {
      place(i);
      break;
    }
  }
  for (const size_t i : chosen) {
    if (!placed[i] && !layouts.count(plans[i].layout)) place(i);
  }
  for (const size_t i : chosen) {
    if (!placed[i]) place(i);
  }
  return out;
}

int64_t fastest(const std::vector<Trial>& trials) {
  int64_t best = -1;
  for (size_t i = 0; i < trials.size(); ++i) {
    if (!trials[i].skipped.empty() || !(trials[i].measured > 0)) continue;
    if (best < 0 || trials[i].measured < trials[static_cast<size_t>(best)].measured) {
      best = static_cast<int64_t>(i);
    }
  }
  return best;
}

}  // namespace kolos::planner
