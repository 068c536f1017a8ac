package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is a throwaway certificate authority in Dir: ca.crt, and <name>.crt/<name>.key for each
// member (server and client use, for 127.0.0.1 and localhost), for "client" (what
// kube-apiserver presents to etcd, as kubeadm's apiserver-etcd-client certificate), for
// "apiserver" (kube-apiserver's serving certificate) and for "admin" (in the group
// system:masters, as kubeadm's admin.conf).
type PKI struct {
	Dir string
}

// NewPKI makes the CA and the certificates of members and of "client".
func NewPKI(dir string, members []string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcd-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir}
	if err := writePEM(p.path("ca.crt"), "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	for i, name := range append(append([]string{}, members...), "client", "apiserver", "admin") {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		template := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)),
			Subject:      subject(name),
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:     []string{"localhost"},
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := writePEM(p.path(name+".crt"), "CERTIFICATE", der); err != nil {
			return nil, err
		}
		if err := writePEM(p.path(name+".key"), "EC PRIVATE KEY", keyDER); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func subject(name string) pkix.Name {
	if name == "admin" {
		return pkix.Name{CommonName: "kubernetes-admin", Organization: []string{"system:masters"}}
	}
	return pkix.Name{CommonName: name}
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func (p *PKI) path(f string) string { return filepath.Join(p.Dir, f) }

// CA is the CA certificate's file.
func (p *PKI) CA() string { return p.path("ca.crt") }

// Cert and Key are who's certificate and key files.
func (p *PKI) Cert(who string) string { return p.path(who + ".crt") }
func (p *PKI) Key(who string) string  { return p.path(who + ".key") }

// MemberFlags are etcd's TLS flags for member name: its certificate on both URLs, client
// certificates required from clients and peers.
func (p *PKI) MemberFlags(name string) []string {
	return []string{
		"--cert-file", p.Cert(name), "--key-file", p.Key(name), "--trusted-ca-file", p.CA(),
		"--peer-cert-file", p.Cert(name), "--peer-key-file", p.Key(name),
		"--peer-trusted-ca-file", p.CA(),
		"--client-cert-auth", "--peer-client-cert-auth",
	}
}

// ClientTLS is a client's configuration presenting who's certificate.
func (p *PKI) ClientTLS(who string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(p.Cert(who), p.Key(who))
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(p.CA())
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", p.CA())
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}, nil
}
