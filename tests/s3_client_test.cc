// SPDX-License-Identifier: Apache-2.0
// The S3 client's pieces that need no server (src/s3/): s3:// paths, the
// encodings libcurl 7.88 signs as given (keys, the canonical query), the
// credentials/region/endpoint resolution as the AWS tools do it, and the
// listing XML.
#include <cstdlib>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "s3/s3_client.h"
#include "s3/s3_config.h"
#include "s3/s3_url.h"
#include "support/scratch_dir.h"

namespace kvfile::s3 {
namespace {

TEST(S3Url, ParsesBucketAndKey) {
  S3Url u;
  ASSERT_TRUE(ParseS3Url("s3://my-bucket.1/corpus/a b.kvpack", &u).ok());
  EXPECT_EQ(u.bucket, "my-bucket.1");
  EXPECT_EQ(u.key, "corpus/a b.kvpack");
  EXPECT_EQ(u.ToString(), "s3://my-bucket.1/corpus/a b.kvpack");
  ASSERT_TRUE(ParseS3Url("s3://bkt", &u).ok());
  EXPECT_EQ(u.key, "");
  ASSERT_TRUE(ParseS3Url("s3://bkt/corpus/", &u).ok());
  EXPECT_EQ(u.key, "corpus/");
}

TEST(S3Url, RefusesWhatS3Refuses) {
  S3Url u;
  for (const char* bad : {"s3://", "s3:///key", "s3://ab/key", "s3://UPPER/key", "s3://-bkt/k", "s3://bkt-/k",
                          "s3://b_kt/k", "/local/path"}) {
    Status st = ParseS3Url(bad, &u);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << bad;
  }
  Status st = ParseS3Url("s3://ab/key", &u);
  EXPECT_EQ(st.message(), "s3://ab/key: not a bucket name (3 to 63 of a-z, 0-9, '.', '-'; s3://BUCKET/KEY)");
  EXPECT_EQ(ParseS3Url("s3://bkt/" + std::string(1025, 'k'), &u).code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(ParseS3Url("s3://bkt/" + std::string(1024, 'k'), &u).ok());
  // "." and ".." segments: curl would send another key than the one named.
  for (const char* dots : {"s3://bkt/a/../x.kv", "s3://bkt/./x.kv", "s3://bkt/a/..", "s3://bkt/.."}) {
    EXPECT_EQ(ParseS3Url(dots, &u).code(), Status::Code::kInvalidArgument) << dots;
  }
  EXPECT_EQ(ParseS3Url("s3://bkt/a/../x.kv", &u).message(),
            "s3://bkt/a/../x.kv: an object key with a '..' segment (it would name another key over HTTP)");
  for (const char* fine : {"s3://bkt/a..b/x.kv", "s3://bkt/.hidden", "s3://bkt/dir/", "s3://bkt/a//b"}) {
    EXPECT_TRUE(ParseS3Url(fine, &u).ok()) << fine;
  }
}

TEST(S3Url, KeysArePercentEncodedKeepingSlashes) {
  EXPECT_EQ(UriEncode("corpus/a b+c=d&e~f_g-h.kv", true), "corpus/a%20b%2Bc%3Dd%26e~f_g-h.kv");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(UriEncode("\xc3\xa9t\xc3\xa9", true), "%C3%A9t%C3%A9");  // UTF-8 bytes, upper-case hex
  EXPECT_EQ(UriEncode("%", true), "%25");
}

TEST(S3Url, QueryIsCanonical) {
  // Sorted by name, '=' always written, values encoded including '/'.
  EXPECT_EQ(CanonicalQuery({{"uploads", ""}}), "uploads=");
  EXPECT_EQ(CanonicalQuery({{"uploadId", "a/b+c"}, {"partNumber", "10"}}), "partNumber=10&uploadId=a%2Fb%2Bc");
  EXPECT_EQ(CanonicalQuery({{"prefix", "corpus/x y"}, {"list-type", "2"}, {"delimiter", "/"}}),
            "delimiter=%2F&list-type=2&prefix=corpus%2Fx%20y");
  EXPECT_EQ(CanonicalQuery({}), "");
}

TEST(S3Url, KeyDirName) {
  EXPECT_EQ(KeyDirName("a/b/c.kv"), "a/b/");
  EXPECT_EQ(KeyDirName("c.kv"), "");
}

TEST(S3Config, ParsesIni) {
  IniSections s = ParseIni("# comment\n[default]\nAWS_Access_Key_ID = AK \n; other\n[profile x]\nregion=eu-west-1\r\n"
                           "stray line\n");
  EXPECT_EQ(s["default"]["aws_access_key_id"], "AK");
  EXPECT_EQ(s["profile x"]["region"], "eu-west-1");
  EXPECT_EQ(s.size(), 2u);
}

// A getenv over a map.
struct Env {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> get() const {
    return [this](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

class S3ConfigFiles : public kvfile::testing::ScratchDirTest {
 protected:
  void Write(const std::string& name, const std::string& text) { std::ofstream(P(name)) << text; }
  Env env() {
    Env e;
    e.vars["HOME"] = P("home");
    e.vars["AWS_SHARED_CREDENTIALS_FILE"] = P("credentials");
    e.vars["AWS_CONFIG_FILE"] = P("config");
    return e;
  }
};

TEST_F(S3ConfigFiles, EnvironmentKeysComeFirst) {
  Write("credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = FILESECRET\n");
  Env e = env();
  e.vars["AWS_ACCESS_KEY_ID"] = "ENVKEY";
  e.vars["AWS_SECRET_ACCESS_KEY"] = "ENVSECRET";
  e.vars["AWS_SESSION_TOKEN"] = "TOKEN";
  e.vars["AWS_DEFAULT_REGION"] = "eu-central-1";
  S3Config c;
  ASSERT_TRUE(ResolveS3Config(e.get(), &c).ok());
  EXPECT_EQ(c.access_key, "ENVKEY");
  EXPECT_EQ(c.secret_key, "ENVSECRET");
  EXPECT_EQ(c.session_token, "TOKEN");
  EXPECT_EQ(c.credentials_source, "the environment (AWS_ACCESS_KEY_ID)");
  EXPECT_EQ(c.region, "eu-central-1");
  EXPECT_EQ(c.endpoint, "https://s3.eu-central-1.amazonaws.com");
}

TEST_F(S3ConfigFiles, ProfileFromTheFiles) {
  Write("credentials", "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
                       "[work]\naws_access_key_id = W\naws_secret_access_key = WS\n");
  Write("config", "[default]\nregion = us-west-2\n[profile work]\nregion = ap-south-1\n"
                  "endpoint_url = http://127.0.0.1:8080/\n");
  Env e = env();
  S3Config c;
  ASSERT_TRUE(ResolveS3Config(e.get(), &c).ok());
  EXPECT_EQ(c.access_key, "D");
  EXPECT_EQ(c.region, "us-west-2");
  EXPECT_EQ(c.credentials_source, "profile 'default' in " + P("credentials"));
  e.vars["AWS_PROFILE"] = "work";
  ASSERT_TRUE(ResolveS3Config(e.get(), &c).ok());
  EXPECT_EQ(c.access_key, "W");
  EXPECT_EQ(c.secret_key, "WS");
  EXPECT_EQ(c.region, "ap-south-1");
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:8080");  // the trailing '/' dropped
  // The environment overrides the profile's region and endpoint.
  e.vars["AWS_REGION"] = "r1";
  e.vars["AWS_DEFAULT_REGION"] = "r2";
  e.vars["AWS_ENDPOINT_URL"] = "http://generic:1";
  e.vars["AWS_ENDPOINT_URL_S3"] = "http://s3only:2";
  ASSERT_TRUE(ResolveS3Config(e.get(), &c).ok());
  EXPECT_EQ(c.region, "r1");
  EXPECT_EQ(c.endpoint, "http://s3only:2");
  e.vars.erase("AWS_ENDPOINT_URL_S3");
  ASSERT_TRUE(ResolveS3Config(e.get(), &c).ok());
  EXPECT_EQ(c.endpoint, "http://generic:1");
}

TEST_F(S3ConfigFiles, KeysInTheConfigFile) {
  Write("config", "[profile cfg]\naws_access_key_id = C\naws_secret_access_key = CS\naws_session_token = T\n");
  Env e = env();
  e.vars["AWS_PROFILE"] = "cfg";
  S3Config c;
  ASSERT_TRUE(ResolveS3Config(e.get(), &c).ok());
  EXPECT_EQ(c.access_key, "C");
  EXPECT_EQ(c.session_token, "T");
  EXPECT_EQ(c.credentials_source, "profile 'cfg' in " + P("config"));
  EXPECT_EQ(c.region, "us-east-1");
}

TEST_F(S3ConfigFiles, MissingKeysAndProfilesSayWhatToSet) {
  Env e = env();
  S3Config c;
  Status st = ResolveS3Config(e.get(), &c);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in " +
                              P("credentials"));
  e.vars["AWS_PROFILE"] = "nope";
  st = ResolveS3Config(e.get(), &c);
  EXPECT_EQ(st.message(), "AWS_PROFILE=nope: no such profile in " + P("credentials") + " or " +
                              P("config"));
  // Half a key pair in the environment is not a key pair.
  e.vars.erase("AWS_PROFILE");
  e.vars["AWS_ACCESS_KEY_ID"] = "only";
  EXPECT_FALSE(ResolveS3Config(e.get(), &c).ok());
  e.vars["AWS_SECRET_ACCESS_KEY"] = "s";
  e.vars["AWS_ENDPOINT_URL"] = "ftp://x";
  st = ResolveS3Config(e.get(), &c);
  EXPECT_EQ(st.message(), "endpoint 'ftp://x': not an http:// or https:// URL");
}

TEST(S3Xml, TagsAndEntities) {
  std::string xml = "<R><Key>a&amp;b&lt;c&#233;&#x41;</Key><Key>two</Key></R>";
  size_t at = 0;
  std::string v;
  ASSERT_TRUE(XmlTag(xml, "Key", &at, &v));
  EXPECT_EQ(v, "a&b<c\xc3\xa9"
               "A");
  ASSERT_TRUE(XmlTag(xml, "Key", &at, &v));
  EXPECT_EQ(v, "two");
  EXPECT_FALSE(XmlTag(xml, "Key", &at, &v));
}

}  // namespace
}  // namespace kvfile::s3
