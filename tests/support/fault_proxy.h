// SPDX-License-Identifier: Apache-2.0
// FaultProxy: a TCP proxy on 127.0.0.1 in front of the test's object store
// that fails the first connections it accepts, each in one of two ways:
// answering its first request "503 Service Unavailable" (Connection:
// close), or closing it at once; the connections after those are
// forwarded byte for byte to the store. It accepts at most
// `max_connections` (a bounded loop) and stops by itself in its
// destructor; it listens on 127.0.0.1 only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace kvfile::testing {

class FaultProxy {
 public:
  enum class Fault { k503, kDrop };

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
  // Forwards bytes both ways until either side closes or the proxy stops.
  void Pump(int client) {
    int store = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(store_port_));
    if (::connect(store, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
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
          for (ssize_t done = 0; done < n;) {
            ssize_t w = ::write(p[1 - i].fd, buf + done, static_cast<size_t>(n - done));
            if (w <= 0) {
              closed = true;
              break;
            }
            done += w;
          }
        }
        if (closed) break;
      }
    }
    ::close(store);
    ::close(client);
  }

  int store_port_;
  Fault fault_;
  int faulty_;
  int max_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;  // touched by the acceptor thread only, joined after it
};

}  // namespace kvfile::testing
