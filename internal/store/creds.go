package store

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"
)

// ErrNoCredentials: no source of the credential chain gave S3 credentials, or
// the first one configured failed. Its message names every source looked in
// and why each gave none. Where that source is a server (web identity's STS, a
// container's endpoint), the error is ErrUnreachable too: a retry may reach it.
var ErrNoCredentials = errors.New("store: no S3 credentials found")

// noCredentials is the chain's ErrNoCredentials.
type noCredentials struct {
	looked      []string // every source, and why it gave none
	unreachable bool     // the source that ended the search is a server
}

func (e *noCredentials) Error() string {
	return ErrNoCredentials.Error() + " (looked in: " + strings.Join(e.looked, "; ") + ")"
}

func (e *noCredentials) Is(target error) bool {
	return target == ErrNoCredentials || e.unreachable && target == ErrUnreachable
}

const (
	// credentialTimeout bounds one request for credentials (STS, a container's
	// endpoint): minio-go makes it detached from the caller's context.
	credentialTimeout = 10 * time.Second
	// imdsTimeout bounds a request to the instance metadata service, which on a
	// machine outside EC2 never answers.
	imdsTimeout = 2 * time.Second
)

// source is one link of the credential chain.
type source struct {
	name     string               // where it looks, for messages
	provider credentials.Provider // nil when the source is not configured here
	skip     string               // why provider is nil
	// optional: a failure is noted and the chain goes on (the default profile
	// missing from a shared file, instance metadata outside EC2). Any other
	// configured source that fails ends the search: another source would be
	// another identity.
	optional bool
	remote   bool // it asks a server (STS, a container's endpoint), whose failure may pass
}

// chain is the credentials.Provider of a store given no credentials: it asks
// minio-go's providers in the AWS tools' order (the environment, the shared
// credentials file, web identity, container credentials, instance metadata)
// and keeps the first that answers until its credentials expire. Unlike
// credentials.Chain, finding none is an error that says where it looked.
type chain struct {
	profile string       // Config.Profile; "" reads AWS_PROFILE
	region  string       // for the STS endpoint of web identity
	client  *http.Client // for STS and container requests (the store's TLS settings)
	imds    *http.Client // for instance metadata
	curr    credentials.Provider
}

var _ credentials.Provider = (*chain)(nil)

// newChain is the chain of a store whose requests go through tr.
func newChain(profile, region string, tr http.RoundTripper) *chain {
	return &chain{profile: profile, region: region,
		client: &http.Client{Transport: tr, Timeout: credentialTimeout},
		imds:   &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: imdsTimeout}} // no proxy, no idle connection left
}

func (c *chain) RetrieveWithCredContext(cc *credentials.CredContext) (credentials.Value, error) {
	c.curr = nil
	e := &noCredentials{}
	for _, s := range c.sources() {
		if s.provider == nil {
			e.looked = append(e.looked, s.name+": "+s.skip)
			continue
		}
		v, err := s.provider.RetrieveWithCredContext(cc)
		if err == nil && (v.AccessKeyID == "" || v.SecretAccessKey == "") {
			err = errors.New("it gave no access key and secret")
		}
		if err == nil {
			c.curr = s.provider
			return v, nil
		}
		e.looked = append(e.looked, s.name+": "+err.Error())
		if !s.optional {
			e.unreachable = s.remote
			break
		}
	}
	return credentials.Value{}, e
}

func (c *chain) Retrieve() (credentials.Value, error) { return c.RetrieveWithCredContext(nil) }

// IsExpired is the current provider's, true before any.
func (c *chain) IsExpired() bool { return c.curr == nil || c.curr.IsExpired() }

// sources lists the chain's links as the environment configures them now.
func (c *chain) sources() []source {
	return []source{envAWSSource(), envMinIOSource(), c.fileSource(), c.webIdentitySource(),
		c.containerSource(), c.imdsSource()}
}

func envAWSSource() source {
	s := source{name: "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)"}
	id, secret := firstEnv("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY"), firstEnv("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY")
	switch {
	case id == "" && secret == "":
		s.skip = "not set"
	case id == "" || secret == "":
		s.skip = "only one of the access key and the secret is set"
	default:
		s.provider = &credentials.EnvAWS{}
	}
	return s
}

func envMinIOSource() source {
	s := source{name: "environment (MINIO_ROOT_USER/MINIO_ROOT_PASSWORD, MINIO_ACCESS_KEY/MINIO_SECRET_KEY)"}
	if os.Getenv("MINIO_ROOT_USER") != "" && os.Getenv("MINIO_ROOT_PASSWORD") != "" ||
		os.Getenv("MINIO_ACCESS_KEY") != "" && os.Getenv("MINIO_SECRET_KEY") != "" {
		s.provider = &credentials.EnvMinio{}
	} else {
		s.skip = "not set"
	}
	return s
}

// fileSource reads the profile from the shared credentials file and the config
// file, as the AWS tools merge them. A profile named (Config.Profile,
// AWS_PROFILE) must be there; the default one may be missing.
func (c *chain) fileSource() source {
	profile := c.profile
	if profile == "" {
		profile = os.Getenv("AWS_PROFILE")
	}
	named := profile != ""
	if !named {
		profile = "default"
	}
	files := []string{os.Getenv("AWS_SHARED_CREDENTIALS_FILE"), os.Getenv("AWS_CONFIG_FILE")}
	if home, err := os.UserHomeDir(); err == nil {
		if files[0] == "" {
			files[0] = filepath.Join(home, ".aws", "credentials")
		}
		if files[1] == "" {
			files[1] = filepath.Join(home, ".aws", "config")
		}
	}
	s := source{name: fmt.Sprintf("shared credentials file %s and config file %s (profile %q)", files[0], files[1], profile), optional: !named}
	found := named // a named profile whose files are missing fails rather than passes
	for _, f := range files {
		if _, err := os.Stat(f); f != "" && err == nil {
			found = true
		}
	}
	if !found {
		s.skip = "no such file"
		return s
	}
	s.provider = &sharedFile{credentials.FileAWSCredentials{Profile: profile}}
	return s
}

// sharedFile is FileAWSCredentials whose errors never repeat a line of the file
// (the ini parser's do, and a malformed line may hold a secret).
type sharedFile struct{ credentials.FileAWSCredentials }

func (p *sharedFile) RetrieveWithCredContext(cc *credentials.CredContext) (credentials.Value, error) {
	v, err := p.FileAWSCredentials.RetrieveWithCredContext(cc)
	if err == nil {
		return v, nil
	}
	var pe *fs.PathError
	switch msg := err.Error(); {
	case errors.As(err, &pe):
	case strings.Contains(msg, "does not exist"):
		err = errors.New("no such profile in it")
	case strings.Contains(msg, "delimiter not found") || strings.Contains(msg, "empty key name"):
		err = errors.New("it cannot be read as an AWS credentials file (a line is malformed)")
	}
	return v, err
}

// webIdentitySource exchanges the token in AWS_WEB_IDENTITY_TOKEN_FILE for the
// role AWS_ROLE_ARN (EKS's IRSA sets both) at STS: AWS_ENDPOINT_URL_STS or
// AWS_ENDPOINT_URL, or the region's.
func (c *chain) webIdentitySource() source {
	s := source{name: "web identity (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN)"}
	if os.Getenv("AWS_WEB_IDENTITY_TOKEN_FILE") == "" {
		s.skip = "not set"
		return s
	}
	sts := firstEnv("AWS_ENDPOINT_URL_STS", "AWS_ENDPOINT_URL")
	if sts == "" {
		sts = awsEndpoint("sts", c.region)
	}
	s.name += " at " + redactEndpoint(sts)
	s.provider, s.remote = &credentials.IAM{Client: c.client, Endpoint: sts}, true
	return s
}

func (c *chain) containerSource() source {
	s := source{name: "container credentials (AWS_CONTAINER_CREDENTIALS_FULL_URI, AWS_CONTAINER_CREDENTIALS_RELATIVE_URI)"}
	if firstEnv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") == "" {
		s.skip = "not set"
		return s
	}
	s.provider, s.remote = &credentials.IAM{Client: c.client}, true
	return s
}

// imdsSource asks EC2's instance metadata service (AWS_EC2_METADATA_SERVICE_ENDPOINT,
// or its link-local address) unless AWS_EC2_METADATA_DISABLED is true.
func (c *chain) imdsSource() source {
	ep := firstEnv("AWS_EC2_METADATA_SERVICE_ENDPOINT")
	if ep == "" {
		ep = credentials.DefaultIAMRoleEndpoint
	}
	s := source{name: "instance metadata " + ep, optional: true}
	if strings.EqualFold(os.Getenv("AWS_EC2_METADATA_DISABLED"), "true") {
		s.skip = "AWS_EC2_METADATA_DISABLED is true"
		return s
	}
	s.provider = &credentials.IAM{Client: c.imds, Endpoint: strings.TrimSuffix(ep, "/")}
	return s
}

// awsEndpoint is the https URL of an AWS service in region (its global
// endpoint when region is empty).
func awsEndpoint(service, region string) string {
	if region == "" {
		return "https://" + service + ".amazonaws.com"
	}
	host := service + "." + region + ".amazonaws.com"
	if strings.HasPrefix(region, "cn-") {
		host += ".cn"
	}
	return "https://" + host
}
