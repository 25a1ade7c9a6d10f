// SPDX-License-Identifier: Apache-2.0
// FaultProxy: a TCP proxy on 127.0.0.1 in front of the test's object store
// that fails the first connections it accepts, each in one of two ways:
// answering its first request "503 Service Unavailable" (Connection:
// close), or closing it at once; the connections after those are
// forwarded byte for byte to the store. Or it loses the answer of the
// first CompleteMultipartUpload (the client's connection closed without
// one), after forwarding that request to the store (kCompleteAnswerLost)
// or without (kCompleteLost), and answers every later one itself
// "404 NoSuchUpload", as AWS S3 answers a retried Complete of an upload
// that is gone (completed, or aborted by another run; Swift's s3api
// completes a retried one again), or "412 PreconditionFailed"
// (kCompleteAnswerLost412: as a store that checks a retried Complete's
// If-None-Match: * against the object the first one made); every other
// request is forwarded. It
// accepts at most `max_connections` (a bounded loop) and stops by itself
// in its destructor; it listens on 127.0.0.1 only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace kvfile::testing {

class FaultProxy {
 public:
  enum class Fault { k503, kDrop, kCompleteAnswerLost, kCompleteLost, kCompleteAnswerLost412 };

  FaultProxy(int store_port, Fault fault, int faulty_connections, int max_connections = 200)
      : store_port_(store_port), fault_(fault), faulty_(faulty_connections), max_(max_connections) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 16) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~FaultProxy() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& t : pumps_) t.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Connections accepted so far.
  int connections() const { return accepted_.load(); }
  // CompleteMultipartUpload requests seen (the Complete faults).
  int completes() const { return completes_.load(); }

 private:
  void Accept() {
    while (!stop_ && accepted_ < max_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      if (accepted_++ < faulty_) {
        if (fault_ == Fault::k503) {
          ReadHead(c);
          static const char kAnswer[] =
              "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
          (void)!::write(c, kAnswer, sizeof kAnswer - 1);
        }
        ::close(c);
        continue;
      }
      if (fault_ != Fault::k503 && fault_ != Fault::kDrop)
        pumps_.emplace_back([this, c] { PumpCompletes(c); });
      else
        pumps_.emplace_back([this, c] { Pump(c); });
    }
  }
  // Reads a request's head (up to the blank line), at most 64 KiB, 2 s.
  static void ReadHead(int fd) {
    std::string head;
    char buf[4096];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 65536) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 2000) <= 0) return;
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return;
      head.append(buf, static_cast<size_t>(n));
    }
  }
  // A connection to the store; -1 if it cannot be made.
  int ConnectStore() const {
    int store = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(store_port_));
    if (::connect(store, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return store;
    ::close(store);
    return -1;
  }
  // Writes n bytes to a socket (a closed peer is false, not SIGPIPE).
  static bool WriteAll(int fd, const char* p, size_t n) {
    for (size_t done = 0; done < n;) {
      ssize_t w = ::send(fd, p + done, n - done, MSG_NOSIGNAL);
      if (w <= 0) return false;
      done += static_cast<size_t>(w);
    }
    return true;
  }
  // Forwards bytes both ways until either side closes or the proxy stops.
  void Pump(int client) {
    int store = ConnectStore();
    if (store >= 0) {
      char buf[65536];
      pollfd p[2] = {{client, POLLIN, 0}, {store, POLLIN, 0}};
      while (!stop_) {
        if (::poll(p, 2, 50) <= 0) continue;
        bool closed = false;
        for (int i = 0; i < 2 && !closed; ++i) {
          if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          ssize_t n = ::read(p[i].fd, buf, sizeof buf);
          if (n <= 0) {
            closed = true;
            break;
          }
          if (!WriteAll(p[1 - i].fd, buf, static_cast<size_t>(n))) closed = true;
        }
        if (closed) break;
      }
    }
    ::close(store);
    ::close(client);
  }
  // The Complete faults: the requests from the client are read one by one
  // (head, then Content-Length bytes of body) and forwarded, except
  // CompleteMultipartUpload (a POST with uploadId=): the first is sent to
  // the store on a connection of its own whose answer is thrown away
  // (kCompleteAnswerLost) or not sent at all (kCompleteLost), and the
  // client's connection is closed; every later one is answered 404
  // NoSuchUpload (or 412) here. The store's answers are forwarded as they
  // come.
  void PumpCompletes(int client) {
    int store = ConnectStore();
    std::string pending;
    size_t body_left = 0;
    char buf[65536];
    pollfd p[2] = {{client, POLLIN, 0}, {store, POLLIN, 0}};
    bool open = store >= 0;
    while (open && !stop_) {
      if (::poll(p, 2, 50) <= 0) continue;
      if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {  // the store's answers, as they are
        ssize_t n = ::read(store, buf, sizeof buf);
        if (n <= 0 || !WriteAll(client, buf, static_cast<size_t>(n))) break;
      }
      if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(client, buf, sizeof buf);
      if (n <= 0) break;
      pending.append(buf, static_cast<size_t>(n));
      while (open && !pending.empty()) {
        if (body_left > 0) {
          size_t take = std::min(body_left, pending.size());
          if (!WriteAll(store, pending.data(), take)) open = false;
          pending.erase(0, take);
          body_left -= take;
          continue;
        }
        size_t end = pending.find("\r\n\r\n");
        if (end == std::string::npos) break;  // the rest of the head is to come
        std::string head = pending.substr(0, end + 4);
        size_t length = ContentLength(head);
        const std::string line = head.substr(0, head.find("\r\n"));
        const bool complete = line.starts_with("POST ") && line.find("uploadId=") != std::string::npos;
        if (!complete) {
          if (!WriteAll(store, head.data(), head.size())) open = false;
          pending.erase(0, head.size());
          body_left = length;
          continue;
        }
        if (pending.size() < head.size() + length) break;  // the rest of its body is to come
        std::string body = pending.substr(head.size(), length);
        pending.erase(0, head.size() + length);
        if (completes_++ == 0) {
          if (fault_ != Fault::kCompleteLost) CompleteAndForget(head, body);
          open = false;  // the client's connection closed: the answer is lost
          break;
        }
        const bool failed = fault_ == Fault::kCompleteAnswerLost412;
        const std::string error =
            failed ? "<Code>PreconditionFailed</Code><Message>At least one of the preconditions you specified did "
                     "not hold.</Message>"
                   : "<Code>NoSuchUpload</Code><Message>The specified multipart upload does not exist.</Message>";
        const std::string xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>" + error + "</Error>";
        std::string answer = std::string(failed ? "HTTP/1.1 412 Precondition Failed" : "HTTP/1.1 404 Not Found") +
                             "\r\nContent-Type: application/xml\r\nContent-Length: " + std::to_string(xml.size()) +
                             "\r\n\r\n" + xml;
        if (!WriteAll(client, answer.data(), answer.size())) open = false;
      }
    }
    if (store >= 0) ::close(store);
    ::close(client);
  }
  static size_t ContentLength(const std::string& head) {
    std::string lower = head;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t at = lower.find("\r\ncontent-length:");
    return at == std::string::npos ? 0 : std::strtoull(lower.c_str() + at + 17, nullptr, 10);
  }
  // Sends a request to the store on a connection of its own (Connection:
  // close, a header the signature does not cover) and reads its answer to
  // the end, which is then dropped.
  void CompleteAndForget(const std::string& head, const std::string& body) {
    int store = ConnectStore();
    if (store < 0) return;
    size_t line_end = head.find("\r\n") + 2;
    std::string closing = head.substr(0, line_end) + "Connection: close\r\n" + head.substr(line_end);
    if (WriteAll(store, closing.data(), closing.size()) && WriteAll(store, body.data(), body.size())) {
      char buf[4096];
      for (;;) {
        pollfd q{store, POLLIN, 0};
        if (::poll(&q, 1, 30000) <= 0 || ::read(store, buf, sizeof buf) <= 0) break;
      }
    }
    ::close(store);
  }

  int store_port_;
  Fault fault_;
  int faulty_;
  int max_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> completes_{0};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;  // touched by the acceptor thread only, joined after it
};

}  // namespace kvfile::testing
