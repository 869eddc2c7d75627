#include "server/peer_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace moetier::server {

namespace {

// The numeric address and port of a socket address (IPv4 or IPv6), as httplib writes a
// request's remote_addr; false for other families.
bool AddressAndPort(const sockaddr_storage& a, std::string* addr, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    if (inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text) == nullptr) return false;
    *port = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text) == nullptr) return false;
    *port = ntohs(v6.sin6_port);
  } else {
    return false;
  }
  *addr = text;
  return true;
}

bool Matches(int fd, const std::string& remote_addr, int remote_port, int local_port) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  std::string addr;
  int port = -1;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0 ||
      !AddressAndPort(a, &addr, &port) || port != local_port)
    return false;
  n = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0 ||
      !AddressAndPort(a, &addr, &port))
    return false;
  return port == remote_port && addr == remote_addr;
}

}  // namespace

int PeerSocket::Find() const {
  if (remote_port_ <= 0 || local_port_ <= 0) return -1;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    char* stop = nullptr;
    const long fd = std::strtol(name.c_str(), &stop, 10);
    if (stop == name.c_str() || *stop != '\0') continue;
    if (Matches(static_cast<int>(fd), remote_addr_, remote_port_, local_port_))
      return static_cast<int>(fd);
  }
  return -1;
}

bool PeerSocket::Closed() {
  if (fd_ == kNotSearched) fd_ = Find();
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) < 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace moetier::server
