// SPDX-License-Identifier: Apache-2.0
// Where the S3 client's credentials, region and endpoint come from, in the
// order the AWS tools take them (docs/object-storage.md, "Credentials").
#pragma once

#include <functional>
#include <map>
#include <string>

#include "kvfile/status.h"

namespace kvfile::s3 {

struct S3Config {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty: none
  std::string region;         // never empty ("us-east-1" when nothing says)
  std::string endpoint;       // "http(s)://host[:port]", no trailing '/'
  // Where the keys came from, for the 403 error line: "the environment
  // (AWS_ACCESS_KEY_ID)", "profile 'x' in /root/.aws/credentials", ...
  std::string credentials_source;
};

// The sections of an INI file such as ~/.aws/credentials: section name ->
// (key -> value); keys lower-cased, values trimmed; '#' and ';' start
// comment lines.
using IniSections = std::map<std::string, std::map<std::string, std::string>>;
IniSections ParseIni(const std::string& text);

// Resolves the configuration from `env` (a getenv: nullptr for unset):
//   keys:     AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
//             else the profile (AWS_PROFILE, else "default") in
//             AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), else in
//             AWS_CONFIG_FILE (~/.aws/config, section "profile NAME" or
//             "default");
//   region:   AWS_REGION, AWS_DEFAULT_REGION, the profile's region in the
//             config file, else us-east-1;
//   endpoint: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
//             endpoint_url, else https://s3.REGION.amazonaws.com.
// kInvalidArgument, naming what to set, when no keys are found or a named
// profile does not exist.
Status ResolveS3Config(const std::function<const char*(const char*)>& env, S3Config* out);

}  // namespace kvfile::s3
