// SPDX-License-Identifier: Apache-2.0
#include "s3/s3_config.h"

#include <fstream>
#include <sstream>

namespace kvfile::s3 {

namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::string Lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

bool ReadText(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return true;
}

std::string Get(const std::function<const char*(const char*)>& env, const char* name) {
  const char* v = env(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

IniSections ParseIni(const std::string& text) {
  IniSections out;
  std::string section;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = Trim(line.substr(1, line.size() - 2));
      out[section];
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string::npos || section.empty()) continue;
    out[section][Lower(Trim(line.substr(0, eq)))] = Trim(line.substr(eq + 1));
  }
  return out;
}

Status ResolveS3Config(const std::function<const char*(const char*)>& env, S3Config* out) {
  S3Config c;
  const std::string home = Get(env, "HOME");
  std::string cred_path = Get(env, "AWS_SHARED_CREDENTIALS_FILE");
  if (cred_path.empty()) cred_path = home + "/.aws/credentials";
  std::string config_path = Get(env, "AWS_CONFIG_FILE");
  if (config_path.empty()) config_path = home + "/.aws/config";
  const std::string named_profile = Get(env, "AWS_PROFILE");
  const std::string profile = named_profile.empty() ? "default" : named_profile;

  std::string text;
  IniSections creds, config;
  bool have_creds = ReadText(cred_path, &text);
  if (have_creds) creds = ParseIni(text);
  bool have_config = ReadText(config_path, &text);
  if (have_config) config = ParseIni(text);
  const std::string config_section = profile == "default" ? "default" : "profile " + profile;
  const auto* in_creds = creds.count(profile) ? &creds[profile] : nullptr;
  const auto* in_config = config.count(config_section) ? &config[config_section] : nullptr;
  auto from_config = [&](const char* key) {
    if (!in_config) return std::string();
    auto it = in_config->find(key);
    return it == in_config->end() ? std::string() : it->second;
  };

  c.access_key = Get(env, "AWS_ACCESS_KEY_ID");
  c.secret_key = Get(env, "AWS_SECRET_ACCESS_KEY");
  if (!c.access_key.empty() && !c.secret_key.empty()) {
    c.session_token = Get(env, "AWS_SESSION_TOKEN");
    c.credentials_source = "the environment (AWS_ACCESS_KEY_ID)";
  } else {
    c.access_key.clear();
    c.secret_key.clear();
    for (auto [section, path, name] : {std::tuple{in_creds, cred_path, std::string("profile '") + profile + "'"},
                                       std::tuple{in_config, config_path, std::string("profile '") + profile + "'"}}) {
      if (!section || !section->count("aws_access_key_id") || !section->count("aws_secret_access_key")) continue;
      c.access_key = section->at("aws_access_key_id");
      c.secret_key = section->at("aws_secret_access_key");
      if (section->count("aws_session_token")) c.session_token = section->at("aws_session_token");
      c.credentials_source = name + " in " + path;
      break;
    }
    if (c.access_key.empty()) {
      if (!named_profile.empty() && !in_creds && !in_config)
        return Status::InvalidArgument("AWS_PROFILE=" + named_profile + ": no such profile in " + cred_path +
                                       " or " + config_path);
      return Status::InvalidArgument(
          "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in " + cred_path);
    }
  }

  c.region = Get(env, "AWS_REGION");
  if (c.region.empty()) c.region = Get(env, "AWS_DEFAULT_REGION");
  if (c.region.empty()) c.region = from_config("region");
  if (c.region.empty()) c.region = "us-east-1";

  c.endpoint = Get(env, "AWS_ENDPOINT_URL_S3");
  if (c.endpoint.empty()) c.endpoint = Get(env, "AWS_ENDPOINT_URL");
  if (c.endpoint.empty()) c.endpoint = from_config("endpoint_url");
  if (c.endpoint.empty()) c.endpoint = "https://s3." + c.region + ".amazonaws.com";
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  if (!c.endpoint.starts_with("http://") && !c.endpoint.starts_with("https://"))
    return Status::InvalidArgument("endpoint '" + c.endpoint + "': not an http:// or https:// URL");
  *out = std::move(c);
  return Status::OK();
}

}  // namespace kvfile::s3
