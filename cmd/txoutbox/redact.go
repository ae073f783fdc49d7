package main

import (
	"bytes"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// A password must never reach the terminal or the logs, in our messages or
// in the errors libraries wrap around a DSN or URL. Two layers do it:
//
//   - redact rewrites one DSN or URL for our own messages, whatever its
//     form (a URL that does not parse, a key/value DSN);
//   - every byte the CLI writes (stdout, stderr, and so the logs) passes a
//     redactingWriter that replaces each password found in the arguments
//     and the TXOUTBOX_ environment, and anything shaped like a password in
//     a URL or a password=... pair, by xxxxx.

const mask = "xxxxx"

var (
	// userinfoRE matches the password of a URL: scheme://user:PASSWORD@.
	// The password runs to the last @ before a space, so that one with an
	// unescaped @ or a bad %-escape is still covered; one with a space is
	// caught by the secrets of the arguments instead.
	userinfoRE = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*):\S*@`)
	// passwordRE matches a password=... pair of a key/value DSN or a query
	// string, quoted or not.
	passwordRE = regexp.MustCompile(`(?i)\b((?:ssl|sasl_)?password\s*=\s*)('(?:\\.|[^'\\])*'|[^\s&']+)`)
)

// redact returns s with every password it holds masked: a URL's userinfo
// password, and password=... pairs.
func redact(s string) string {
	s = userinfoRE.ReplaceAllString(s, "${1}:"+mask+"@")
	return passwordRE.ReplaceAllString(s, "${1}"+mask)
}

// secretsIn returns the passwords s holds, as written and %-decoded.
func secretsIn(s string) []string {
	var out []string
	add := func(p string) {
		p = strings.Trim(p, "'")
		if p == "" {
			return
		}
		out = append(out, p)
		if u, err := url.PathUnescape(p); err == nil && u != p {
			out = append(out, u)
		}
		if u, err := url.QueryUnescape(p); err == nil && u != p {
			out = append(out, u)
		}
	}
	for rest := s; ; {
		i := strings.Index(rest, "://")
		if i < 0 {
			break
		}
		rest = rest[i+3:]
		end := len(rest)
		if j := strings.IndexAny(rest, " \t\n"); j >= 0 && strings.LastIndex(rest[:j], "@") >= 0 {
			end = j
		}
		if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
			if c := strings.Index(rest[:at], ":"); c >= 0 {
				add(rest[c+1 : at])
			}
		}
	}
	if !strings.Contains(s, "://") {
		// user:password@host written without a scheme.
		if at := strings.LastIndex(s, "@"); at > 0 {
			if c := strings.Index(s[:at], ":"); c >= 0 {
				add(s[c+1 : at])
			}
		}
	}
	for _, m := range passwordRE.FindAllStringSubmatch(s, -1) {
		add(m[2])
	}
	// A local keeper's URL is its key (--keeper ID=base64key://KEY).
	for rest := s; ; {
		i := strings.Index(rest, "base64key://")
		if i < 0 {
			break
		}
		rest = rest[i+len("base64key://"):]
		end := strings.IndexAny(rest, " \t\n'\"?&")
		if end < 0 {
			end = len(rest)
		}
		add(rest[:end])
	}
	return out
}

// collectSecrets returns the passwords in args and in the TXOUTBOX_
// environment, longest first (so that one containing another is masked
// whole). Passwords shorter than 3 bytes are left to the shape-based
// redact: masking every "a" of the output would hide everything else.
func collectSecrets(args []string) []string {
	var all []string
	for _, a := range args {
		all = append(all, secretsIn(a)...)
	}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, envPrefix) {
			_, v, _ := strings.Cut(kv, "=")
			all = append(all, secretsIn(v)...)
		}
	}
	all = slices.DeleteFunc(all, func(s string) bool { return len(s) < 3 })
	slices.SortFunc(all, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(all)
}

// redactingWriter masks secrets and password-shaped text in what it writes.
// Writers of the CLI write whole lines or messages per call.
type redactingWriter struct {
	w       io.Writer
	mu      sync.Mutex
	secrets [][]byte
}

func newRedactingWriter(w io.Writer, secrets []string) *redactingWriter {
	r := &redactingWriter{w: w}
	for _, s := range secrets {
		r.secrets = append(r.secrets, []byte(s))
	}
	return r
}

// Write writes p with the secrets masked; it reports len(p) on success,
// since the caller's bytes were all taken care of.
func (r *redactingWriter) Write(p []byte) (int, error) {
	out := []byte(redact(string(p)))
	for _, s := range r.secrets {
		out = bytes.ReplaceAll(out, s, []byte(mask))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Unwrap returns the writer under r, for terminal detection.
func (r *redactingWriter) Unwrap() io.Writer { return r.w }
