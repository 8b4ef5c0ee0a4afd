#include "common/auth/tls_credentials.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace kvserve::auth {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot open '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::string pem = text.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' holds no PEM block (-----BEGIN ...)"));
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsFiles& files, const std::string& flag_prefix) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  const std::string cert_flag = absl::StrCat("--", flag_prefix, "tls-cert");
  const std::string key_flag = absl::StrCat("--", flag_prefix, "tls-key");
  const std::string ca_flag = absl::StrCat("--", flag_prefix, "tls-client-ca");
  if (files.cert_path.empty() || files.key_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        cert_flag, "/", key_flag, ": TLS needs both a certificate and its key",
        files.client_ca_path.empty() ? "" : absl::StrCat(" (", ca_flag, " requires them)")));
  }
  absl::StatusOr<std::string> cert = ReadPemFile(files.cert_path, cert_flag);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(files.key_path, key_flag);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  if (!files.client_ca_path.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(files.client_ca_path, ca_flag);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  if (credentials == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_flag, "/", key_flag, ": gRPC rejected the certificate or key"));
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelTlsFiles& files, const std::string& flag_names) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  std::vector<std::string> names = absl::StrSplit(flag_names, ',');
  names.resize(3);
  if (files.cert_path.empty() != files.key_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        names[1], "/", names[2], ": a client certificate needs its key and vice versa"));
  }
  grpc::SslCredentialsOptions options;
  if (!files.ca_path.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(files.ca_path, names[0]);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  if (!files.cert_path.empty()) {
    absl::StatusOr<std::string> cert = ReadPemFile(files.cert_path, names[1]);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(files.key_path, names[2]);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(options);
  if (credentials == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(names[0], ": gRPC rejected the TLS settings"));
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakePeerChannelCredentials(
    const ServerTlsFiles& own) {
  ChannelTlsFiles peers;
  peers.ca_path = own.client_ca_path;
  peers.cert_path = own.cert_path;
  peers.key_path = own.key_path;
  return MakeChannelCredentials(peers, "--tls-client-ca,--tls-cert,--tls-key");
}

}  // namespace kvserve::auth
