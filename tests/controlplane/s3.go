package main

// The S3-compatible object store of the backup tests: gofakes3 (a server of the S3 REST
// protocol: buckets, objects, multipart uploads, ListObjectsV2, path-style and virtual-host
// addressing) on a bolt file, so its objects outlive a restart of the process.
//
//	controlplane s3 --listen 127.0.0.1:9000 --data DIR/s3.bolt --bucket backups --access-key KEY
//
// gofakes3 does not check request signatures. In front of it, every request must carry an AWS
// Signature V4 Authorization header (or presigned query) naming --access-key, else 403
// AccessDenied, as S3 answers a request from an unknown key; the signature itself is not
// verified.

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"strings"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3bolt"
)

func runS3(args []string) int {
	flags := flag.NewFlagSet("s3", flag.ContinueOnError)
	listen := flags.String("listen", "127.0.0.1:9000", "address to serve on")
	data := flags.String("data", "s3.bolt", "bolt file holding the objects")
	bucket := flags.String("bucket", "", "bucket to create at start (optional)")
	accessKey := flags.String("access-key", "", "the only access key id let in (required)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *accessKey == "" {
		fmt.Fprintln(flags.Output(), "s3: --access-key is required")
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
	handler := keyCheck(*accessKey, faker.Server())
	log.Printf("s3: serving %s on %s", *data, *listen)
	if err := http.ListenAndServe(*listen, handler); err != nil {
		log.Printf("s3: %v", err)
		return 1
	}
	return 0
}

// keyCheck lets in only requests signed (SigV4) with the access key id `key`.
func keyCheck(key string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		credential := r.URL.Query().Get("X-Amz-Credential")
		if auth := r.Header.Get("Authorization"); strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") {
			for _, part := range strings.Split(strings.TrimPrefix(auth, "AWS4-HMAC-SHA256 "), ",") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(part), "Credential="); ok {
					credential = v
				}
			}
		}
		if id, _, _ := strings.Cut(credential, "/"); id != key {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>`)
			return
		}
		next.ServeHTTP(w, r)
	})
}
