#ifndef KVSERVE_COMMON_AUTH_TLS_CREDENTIALS_H_
#define KVSERVE_COMMON_AUTH_TLS_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace kvserve::auth {

/// PEM files a server presents and checks. All empty: plaintext.
struct ServerTlsFiles {
  /// Certificate chain (PEM) and its private key (PEM); both or neither.
  std::string cert_path;
  std::string key_path;
  /// When set: clients must present a certificate signed by this CA (mutual TLS); handshakes
  /// without one, or with one from another CA, are refused. Requires cert_path/key_path.
  std::string client_ca_path;

  bool enabled() const {
    return !cert_path.empty() || !key_path.empty() || !client_ca_path.empty();
  }
};

/// PEM files a client uses to reach a TLS server. All empty: plaintext.
struct ChannelTlsFiles {
  /// The CA that signed the server's certificate. Empty with a client certificate set: the
  /// system's roots.
  std::string ca_path;
  /// Client certificate chain and key (PEM), for servers that require one; both or neither.
  std::string cert_path;
  std::string key_path;
  /// Name to check the server's certificate against instead of the dialled host (SNI too).
  std::string server_name;

  bool enabled() const { return !ca_path.empty() || !cert_path.empty() || !key_path.empty(); }
};

/// The whole file as a string; NOT_FOUND naming `flag` and the path when it cannot be read,
/// INVALID_ARGUMENT when it holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag);

/// Server credentials from the files (insecure ones when !files.enabled()). `flag_prefix`
/// ("" or "worker-") names the flags in errors: "--tls-cert", "--worker-tls-cert", ...
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files, const std::string& flag_prefix = "");

/// Channel credentials from the files (insecure ones when !files.enabled()).
/// `flag_names` names the CA, certificate and key flags in errors, comma-separated
/// ("--worker-ca,--worker-tls-cert,--worker-tls-key").
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelTlsFiles& files, const std::string& flag_names = "--tls-ca,--tls-cert,--tls-key");

/// Credentials for a worker dialling its peers (other workers, a pipeline leader) with its own
/// server files: its --tls-cert/--tls-key as the client certificate, its --tls-client-ca as the
/// CA of the peers' certificates. Insecure ones when `own` has no TLS.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakePeerChannelCredentials(
    const ServerTlsFiles& own);

}  // namespace kvserve::auth

#endif  // KVSERVE_COMMON_AUTH_TLS_CREDENTIALS_H_
