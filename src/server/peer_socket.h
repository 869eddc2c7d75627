// Whether the client of an HTTP request has hung up, for answers that send nothing until they
// are whole (a non-streamed completion): cpp-httplib 0.11 hands a handler neither its socket nor
// such a check. The request's socket is found once among this process's descriptors by its two
// ends (the client's address and port, the server's port), then polled for the peer's hang-up.
// Linux only; where the socket is not found, the client never counts as gone.
#pragma once

#include <string>
#include <utility>

namespace moetier::server {

class PeerSocket {
 public:
  PeerSocket(std::string remote_addr, int remote_port, int local_port)
      : remote_addr_(std::move(remote_addr)), remote_port_(remote_port), local_port_(local_port) {}

  // True once the client has closed its end (or the connection failed). Does not wait.
  bool Closed();

 private:
  int Find() const;  // the descriptor, or -1

  std::string remote_addr_;
  int remote_port_;
  int local_port_;
  int fd_ = kNotSearched;
  static constexpr int kNotSearched = -2;
};

}  // namespace moetier::server
