// The web chat UI's static files (webui/), built into the binary by cmake/embed_files.cmake and
// served by `inferd serve` at / (docs/server.md, "Web UI").
#pragma once

#include <span>
#include <string_view>

namespace inferd {

struct WebAsset {
  std::string_view path;          // as requested: "/", "/webui/app.js", ...
  std::string_view content_type;  // with its charset
  std::string_view body;
};

std::span<const WebAsset> webui_assets();

}  // namespace inferd
