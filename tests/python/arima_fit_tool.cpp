// Helper of arima_vs_statsmodels.py: fits ARIMA(p,d,q) to the numbers on stdin with lbbsp's Hannan-Rissanen
// and prints the coefficients, our one-step forecast and the ArimaPredictor's prediction as one JSON line.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "predictors/arima.hpp"

using namespace lbbsp::predictors;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: arima_fit_tool P D Q < series\n");
    return 2;
  }
  const int p = std::atoi(argv[1]), d = std::atoi(argv[2]), q = std::atoi(argv[3]);
  std::vector<double> x;
  for (double v; std::cin >> v;) x.push_back(v);
  ArmaFit fit;
  const double forecast = arima_forecast(x, p, d, q, &fit);
  ArimaOptions options;
  options.p = p, options.d = d, options.q = q, options.window = static_cast<int>(x.size());
  ArimaPredictor predictor(options);
  for (double v : x) predictor.observe(v, {});
  auto list = [](const std::vector<double>& v) {
    std::string s = "[";
    char buf[40];
    for (size_t i = 0; i < v.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s%.17g", i ? "," : "", v[i]);
      s += buf;
    }
    return s + "]";
  };
  std::printf(
      "{\"ok\": %s, \"mean\": %.17g, \"ar\": %s, \"ma\": %s, \"forecast\": %.17g, \"predictor\": %.17g}\n",
      fit.ok ? "true" : "false", fit.mean, list(fit.ar).c_str(), list(fit.ma).c_str(), forecast,
      predictor.predict({}));
  return fit.ok ? 0 : 1;
}
