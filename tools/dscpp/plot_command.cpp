// `dscpp plot`: each panel maps its series' range onto its box, with "nice" round ticks (1, 2 or 5 × 10^k apart).
#include "plot_command.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace dscpp {
namespace {

struct Series {
  const char* key;
  const char* label;
  const char* color;
  std::vector<std::pair<double, double>> points;  // (step, value), finite only
};

constexpr double kWidth = 860, kPanelHeight = 210, kLeft = 90, kRight = 30, kTop = 50, kGap = 40;

// About `count` round tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int count = 5) {
  const double raw = (hi - lo) / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

std::string number(double v) {
  char s[32];
  const double a = std::abs(v);
  std::snprintf(s, sizeof s, (a != 0 && (a < 1e-2 || a >= 1e5)) ? "%.3g" : "%.4g", v);
  return s;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// Value range with some room; a constant series gets a band around its value.
std::pair<double, double> range_of(const std::vector<double>& values) {
  double lo = *std::min_element(values.begin(), values.end());
  double hi = *std::max_element(values.begin(), values.end());
  if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) {
    const double pad = std::abs(hi) > 0 ? std::abs(hi) * 0.1 : 1.0;
    return {lo - pad, hi + pad};
  }
  return {lo, hi};
}

}  // namespace

CLI::App* add_plot_command(CLI::App& app, PlotArgs& args) {
  CLI::App* plot = app.add_subcommand("plot", "Loss, lr and throughput over steps of a gpt-train --metrics file, "
                                              "as an SVG");
  plot->add_option("metrics", args.metrics, "the metrics JSONL file")->required();
  plot->add_option("-o,--output", args.output, "the SVG to write (default loss.svg)");
  plot->add_option("--title", args.title, "title above the panels (default: the metrics file's name)");
  return plot;
}

std::string render_plot(std::istream& jsonl, const std::string& source, const std::string& title,
                        PlotSummary& summary) {
  std::vector<Series> series = {{"loss", "loss", "#1f77b4", {}},
                                {"lr", "learning rate", "#d62728", {}},
                                {"tokens_per_s", "tokens/s", "#2ca02c", {}}};
  int line_number = 0;
  for (std::string line; std::getline(jsonl, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument(source + ":" + std::to_string(line_number) + ": not JSON (" + e.what() + ")");
    }
    if (!row.is_object()) {
      throw std::invalid_argument(source + ":" + std::to_string(line_number) + ": not a JSON object");
    }
    if (!row.contains("step") || !row["step"].is_number()) continue;
    ++summary.steps;
    const double step = row["step"].get<double>();
    for (auto& s : series) {
      if (!row.contains(s.key)) continue;
      // JSON has no NaN: the writer stores a non-finite loss as null.
      if (!row[s.key].is_number() || !std::isfinite(row[s.key].get<double>())) {
        ++summary.skipped_values;
        continue;
      }
      s.points.emplace_back(step, row[s.key].get<double>());
    }
  }
  if (summary.steps == 0) throw std::invalid_argument(source + ": no line with a \"step\"; is it a --metrics file?");

  double x_lo = 1e300, x_hi = -1e300;
  for (const auto& s : series) {
    for (const auto& p : s.points) x_lo = std::min(x_lo, p.first), x_hi = std::max(x_hi, p.first);
  }
  if (x_lo > x_hi) x_lo = 0, x_hi = 1;
  if (x_hi == x_lo) x_lo -= 0.5, x_hi += 0.5;
  const double plot_w = kWidth - kLeft - kRight;
  const double height = kTop + 3 * kPanelHeight + 2 * kGap + 50;
  auto x_of = [&](double step) { return kLeft + (step - x_lo) / (x_hi - x_lo) * plot_w; };

  std::string svg;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                kWidth, height, kWidth, height);
  svg += buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"28\" font-size=\"16\" text-anchor=\"middle\">", kWidth / 2);
  svg += buf + escape(title) + "</text>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    const double top = kTop + i * (kPanelHeight + kGap), bottom = top + kPanelHeight;
    std::snprintf(buf, sizeof buf,
                  "<g class=\"panel\" id=\"%s\">\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                  "fill=\"none\" stroke=\"#444\"/>\n",
                  s.key, kLeft, top, plot_w, kPanelHeight);
    svg += buf;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"18\" y=\"%.1f\" transform=\"rotate(-90 18 %.1f)\" text-anchor=\"middle\">%s</text>\n",
                  (top + bottom) / 2, (top + bottom) / 2, s.label);
    svg += buf;
    for (double t : ticks(x_lo, x_hi)) {
      std::snprintf(buf, sizeof buf,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                    "text-anchor=\"middle\">%s</text>\n",
                    x_of(t), top, x_of(t), bottom, x_of(t), bottom + 15, number(t).c_str());
      svg += buf;
    }
    if (s.points.empty()) {
      std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">no %s in the file</text>\n",
                    kLeft + plot_w / 2, (top + bottom) / 2, s.key);
      svg += buf;
      svg += "</g>\n";
      continue;
    }
    std::vector<double> values;
    for (const auto& p : s.points) values.push_back(p.second);
    // Plain names, not a structured binding: C++17 lambdas cannot capture one (clang refuses it).
    const std::pair<double, double> y_range = range_of(values);
    const double y_lo = y_range.first, y_hi = y_range.second;
    auto y_of = [&](double v) { return bottom - (v - y_lo) / (y_hi - y_lo) * kPanelHeight; };
    for (double t : ticks(y_lo, y_hi)) {
      std::snprintf(buf, sizeof buf,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                    "text-anchor=\"end\">%s</text>\n",
                    kLeft, y_of(t), kLeft + plot_w, y_of(t), kLeft - 6, y_of(t) + 4, number(t).c_str());
      svg += buf;
    }
    svg += "<polyline fill=\"none\" stroke=\"" + std::string(s.color) + "\" stroke-width=\"1.5\" points=\"";
    for (const auto& [step, v] : s.points) {
      std::snprintf(buf, sizeof buf, "%.2f,%.2f ", x_of(step), y_of(v));
      svg += buf;
    }
    svg += "\"/>\n</g>\n";
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
                kLeft + plot_w / 2, height - 12);
  svg += buf;
  svg += "</svg>\n";
  return svg;
}

void run_plot(const PlotArgs& args, std::ostream& out, std::ostream& err) {
  std::ifstream in(args.metrics);
  if (!in) throw std::runtime_error("cannot read " + args.metrics);
  PlotSummary summary;
  const auto svg = render_plot(in, args.metrics, args.title.empty() ? args.metrics : args.title, summary);
  if (summary.skipped_values > 0) {
    err << "dscpp plot: left out " << summary.skipped_values << " non-finite value(s) (overflowed steps)\n";
  }
  std::ofstream file(args.output);
  file << svg;
  file.close();
  if (!file) throw std::runtime_error("cannot write " + args.output);
  out << "wrote " << args.output << " (" << summary.steps << " steps)\n";
}

}  // namespace dscpp
