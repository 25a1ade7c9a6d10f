// SPDX-License-Identifier: Apache-2.0
// The translation unit that owns the tests' precompiled header
// (tests/CMakeLists.txt, kvfile_test_pch): it defines nothing.
