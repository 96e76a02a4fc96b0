package store

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// endpoint is a parsed S3 endpoint.
type endpoint struct {
	host   string        // host:port, what minio-go connects to
	secure bool          // https
	user   *url.Userinfo // credentials written into the URL, or nil
}

// parseEndpoint reads host:port or http(s)://[user:secret@]host:port. A secret may
// hold any character but '@' unescaped ('/' and '+' included, as AWS secrets do).
// Its errors wrap ErrBadURL and show the endpoint with any credentials replaced.
func parseEndpoint(ep string) (endpoint, error) {
	shown := redactEndpoint(ep)
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		scheme, rest = "http", ep
	}
	var user *url.Userinfo
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		name, secret, hasSecret := strings.Cut(rest[:i], ":")
		user = url.User(unescape(name))
		if hasSecret {
			user = url.UserPassword(unescape(name), unescape(secret))
		}
		rest = rest[i+1:]
	}
	u, err := url.Parse(scheme + "://" + rest)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL
		}
		return endpoint{}, fmt.Errorf("%w: endpoint %s: %w", ErrBadURL, shown, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return endpoint{}, fmt.Errorf("%w: endpoint %s: scheme must be http or https", ErrBadURL, shown)
	}
	if u.Host == "" {
		return endpoint{}, fmt.Errorf("%w: endpoint %s has no host", ErrBadURL, shown)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return endpoint{}, fmt.Errorf("%w: endpoint %s must be only a scheme, host and port", ErrBadURL, shown)
	}
	return endpoint{host: u.Host, secure: u.Scheme == "https", user: user}, nil
}

// unescape decodes %XX escapes in a user or secret, leaving s as it is when it
// holds none that decode.
func unescape(s string) string {
	if v, err := url.PathUnescape(s); err == nil {
		return v
	}
	return s
}

// credentials returns the credentials to use when the endpoint carries some: they
// serve when none were given, and must agree with those that were.
func (e endpoint) credentials(given Credentials, shown string) (Credentials, error) {
	if e.user == nil {
		return given, nil
	}
	secret, _ := e.user.Password()
	fromURL := Credentials{AccessKey: e.user.Username(), SecretKey: secret, SessionToken: given.SessionToken}
	switch {
	case given.AccessKey == "" && given.SecretKey == "":
		return fromURL, nil
	case given.AccessKey == fromURL.AccessKey && given.SecretKey == fromURL.SecretKey:
		return given, nil
	}
	return Credentials{}, fmt.Errorf("%w: endpoint %s carries credentials that differ from the ones given: give them one way", ErrBadURL, shown)
}

// redactEndpoint returns s (an endpoint or a store URL) with any user and secret
// written into it replaced by "xxxxx": everything between the scheme and the last
// '@', since a secret may itself hold '/', ':' or '?'.
func redactEndpoint(s string) string {
	start := 0
	if i := strings.Index(s, "://"); i >= 0 {
		start = i + 3
	}
	at := strings.LastIndex(s[start:], "@")
	if at < 0 {
		return s
	}
	return s[:start] + "xxxxx" + s[start+at:]
}
