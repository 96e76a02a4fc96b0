package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

// TLSFiles are a certificate authority of a test's own and a server certificate
// it signed for 127.0.0.1 and localhost, written as files.
type TLSFiles struct {
	CAFile   string         // the authority's certificate, PEM
	CertsDir string         // public.crt and private.key, as MinIO's --certs-dir takes them
	Pool     *x509.CertPool // trusts the authority only
}

// NewTLSFiles makes a new authority and server certificate in a temporary folder.
func NewTLSFiles(t testing.TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey, caCert := newCert(t, "memsnap test CA", nil, nil)
	srvKey, srvCert := newCert(t, "127.0.0.1", caKey, caCert)
	f := TLSFiles{CAFile: filepath.Join(dir, "ca.pem"), CertsDir: filepath.Join(dir, "certs"), Pool: x509.NewCertPool()}
	f.Pool.AddCert(caCert)
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, f.CAFile, "CERTIFICATE", caCert.Raw)
	writePEM(t, filepath.Join(f.CertsDir, "public.crt"), "CERTIFICATE", srvCert.Raw)
	writePEM(t, filepath.Join(f.CertsDir, "private.key"), "PRIVATE KEY", keyDER)
	return f
}

// newCert makes a key and a certificate: a self-signed authority when parent
// is nil, else a server certificate for loopback that parent signs.
func newCert(t testing.TB, name string, parentKey *ecdsa.PrivateKey, parent *x509.Certificate) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
		parent, parentKey = tmpl, key
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
