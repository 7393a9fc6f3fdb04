package main

// The S3-compatible object store of the backup tests: gofakes3 (a server of the S3 REST
// protocol: buckets, objects, multipart uploads, ListObjectsV2, path-style and virtual-host
// addressing) on a bolt file, so its objects outlive a restart of the process.
//
//	controlplane s3 --listen 127.0.0.1:9000 --data DIR/s3.bolt --bucket backups \
//	    --access-key KEY --secret-key SECRET
//
// gofakes3 does not check request signatures. In front of it, every request must be signed
// with AWS Signature V4 (an Authorization header, or a presigned query) by --access-key and
// --secret-key, as S3 checks it: another key id is refused with 403 InvalidAccessKeyId, a
// signature that is not the one the secret gives (a wrong secret, a request changed after it
// was signed) with 403 SignatureDoesNotMatch, a signed request without x-amz-content-sha256
// with 400 InvalidRequest, and a body whose SHA-256 is not the signed x-amz-content-sha256
// with 400 XAmzContentSHA256Mismatch.

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3bolt"
)

func init() {
	register("s3", runS3)
}

func runS3(args []string) int {
	flags := flag.NewFlagSet("s3", flag.ContinueOnError)
	listen := flags.String("listen", "127.0.0.1:9000", "address to serve on")
	data := flags.String("data", "s3.bolt", "bolt file holding the objects")
	bucket := flags.String("bucket", "", "bucket to create at start (optional)")
	accessKey := flags.String("access-key", "", "the only access key id let in (required)")
	secretKey := flags.String("secret-key", "", "its secret: every signature is checked with it (required)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *accessKey == "" || *secretKey == "" {
		fmt.Fprintln(flags.Output(), "s3: --access-key and --secret-key are required")
		return 2
	}
	backend, err := s3bolt.NewFile(*data)
	if err != nil {
		log.Printf("s3: open %s: %v", *data, err)
		return 1
	}
	if *bucket != "" {
		if err := backend.CreateBucket(*bucket); err != nil && !errors.As(err, new(gofakes3.Error)) {
			log.Printf("s3: create bucket %s: %v", *bucket, err)
			return 1
		}
	}
	faker := gofakes3.New(backend, gofakes3.WithAutoBucket(false))
	handler := signatureCheck(*accessKey, *secretKey, faker.Server())
	log.Printf("s3: serving %s on %s", *data, *listen)
	if err := http.ListenAndServe(*listen, handler); err != nil {
		log.Printf("s3: %v", err)
		return 1
	}
	return 0
}

// refuse answers as S3 does, with its XML error (a HEAD's answer has no body: the log says).
func refuse(w http.ResponseWriter, r *http.Request, status int, code, message string) {
	log.Printf("s3: %s %s refused: %d %s", r.Method, r.URL.Path, status, code)
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>%s</Message></Error>`, code, message)
}

// signatureCheck lets in only requests signed (SigV4) with the access key id `key` and its
// secret `secret`, computing the signature as S3 does.
func signatureCheck(key, secret string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var credential, signedHeaders, signature, amzDate, payload string
		presigned := q.Get("X-Amz-Signature") != ""
		if auth := r.Header.Get("Authorization"); strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") {
			for _, part := range strings.Split(strings.TrimPrefix(auth, "AWS4-HMAC-SHA256 "), ",") {
				k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
				switch k {
				case "Credential":
					credential = v
				case "SignedHeaders":
					signedHeaders = v
				case "Signature":
					signature = v
				}
			}
			amzDate = r.Header.Get("X-Amz-Date")
			payload = r.Header.Get("X-Amz-Content-Sha256")
		} else if presigned {
			credential = q.Get("X-Amz-Credential")
			signedHeaders = q.Get("X-Amz-SignedHeaders")
			signature = q.Get("X-Amz-Signature")
			amzDate = q.Get("X-Amz-Date")
			payload = "UNSIGNED-PAYLOAD"
		}
		id, scope, _ := strings.Cut(credential, "/")
		if id != key {
			refuse(w, r, http.StatusForbidden, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
			return
		}
		if payload == "" {
			// S3 wants the payload's hash (or UNSIGNED-PAYLOAD) said in a header.
			refuse(w, r, http.StatusBadRequest, "InvalidRequest", "Missing required header for this request: x-amz-content-sha256")
			return
		}
		// The body must be what was signed (S3 checks it as it reads it).
		if payload != "UNSIGNED-PAYLOAD" && !strings.HasPrefix(payload, "STREAMING-") {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				refuse(w, r, http.StatusBadRequest, "IncompleteBody", err.Error())
				return
			}
			sum := sha256.Sum256(body)
			if hex.EncodeToString(sum[:]) != payload {
				refuse(w, r, http.StatusBadRequest, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed.")
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		want := sign(r, secret, scope, signedHeaders, amzDate, payload, presigned)
		if !hmac.Equal([]byte(want), []byte(signature)) {
			refuse(w, r, http.StatusForbidden, "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided. Check your key and signing method.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// uriEncode encodes s as SigV4 asks (RFC 3986: only A-Z a-z 0-9 - _ . ~ kept).
func uriEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if ('A' <= c && c <= 'Z') || ('a' <= c && c <= 'z') || ('0' <= c && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// sign is the SigV4 signature of r: the canonical request (method, path, sorted query, the
// signed headers, the payload's hash), the string to sign over the credential scope, and the
// HMAC chain of the secret over the scope's date, region and service.
func sign(r *http.Request, secret, scope, signedHeaders, amzDate, payload string, presigned bool) string {
	path := r.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	query := url.Values{}
	for k, vs := range r.URL.Query() {
		if presigned && k == "X-Amz-Signature" {
			continue
		}
		query[k] = vs
	}
	keys := make([]string, 0, len(query))
	for k := range query {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var pairs []string
	for _, k := range keys {
		vs := append([]string(nil), query[k]...)
		sort.Strings(vs)
		for _, v := range vs {
			pairs = append(pairs, uriEncode(k)+"="+uriEncode(v))
		}
	}
	var headers strings.Builder
	for _, h := range strings.Split(signedHeaders, ";") {
		var v string
		if h == "host" {
			v = r.Host
		} else {
			v = strings.Join(r.Header.Values(h), ",")
		}
		fmt.Fprintf(&headers, "%s:%s\n", h, strings.Join(strings.Fields(v), " "))
	}
	canonical := strings.Join([]string{r.Method, path, strings.Join(pairs, "&"), headers.String(), signedHeaders, payload}, "\n")
	hashed := sha256.Sum256([]byte(canonical))
	toSign := strings.Join([]string{"AWS4-HMAC-SHA256", amzDate, scope, hex.EncodeToString(hashed[:])}, "\n")
	mac := func(k []byte, s string) []byte {
		h := hmac.New(sha256.New, k)
		h.Write([]byte(s))
		return h.Sum(nil)
	}
	k := []byte("AWS4" + secret)
	for _, part := range strings.Split(scope, "/") {
		k = mac(k, part)
	}
	return hex.EncodeToString(mac(k, toSign))
}
