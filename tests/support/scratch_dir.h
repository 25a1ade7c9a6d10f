// SPDX-License-Identifier: Apache-2.0
// ScratchDirTest: the base fixture of tests that work on real files, one
// fresh directory per test, removed after it.
#pragma once

#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace kvfile::testing {

// TempDir()/kvfile_<Suite>.<Test>_<pid>: unique per test and per process,
// so that tests run in parallel (ctest -j) never share a directory. Any
// character but [A-Za-z0-9_.-] (a parameterized test's '/') becomes '_':
// tests pass these paths through the shell unquoted.
inline std::filesystem::path ScratchDirForCurrentTest() {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = "kvfile_";
  name += t ? std::string(t->test_suite_name()) + "." + t->name() : std::string("no_test");
  name += "_" + std::to_string(::getpid());
  for (char& c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) c = '_';
  return std::filesystem::path(::testing::TempDir()) / name;
}

class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ScratchDirForCurrentTest();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // The path of `name` in the test's directory.
  std::string P(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

}  // namespace kvfile::testing
