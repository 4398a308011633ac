package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// NewTLS generates, in a directory of the test's, a CA and a server
// certificate it signed for localhost and 127.0.0.1 (ECDSA P-256, valid a
// day), and returns their files and a client config that trusts the CA.
func NewTLS(tb testing.TB) *TLS {
	tb.Helper()
	dir := tb.TempDir()
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatalf("NewTLS: %v", err)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redsem test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(err)
	caCert, err := x509.ParseCertificate(caDER)
	must(err)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	// Client and server auth: the nodes also dial each other (replication,
	// sentinel monitoring) with it.
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	must(err)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	must(err)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		must(os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	return &TLS{
		CAFile:   write("ca.pem", "CERTIFICATE", caDER),
		CertFile: write("server.pem", "CERTIFICATE", srvDER),
		KeyFile:  write("server.key", "EC PRIVATE KEY", keyDER),
		Config:   &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12},
	}
}
