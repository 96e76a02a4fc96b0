#!/usr/bin/env bash
# Regenerate internal/pb from memsnap.proto. Needs protoc (Debian: protobuf-compiler) and
# protoc-gen-go (go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12).
# The generated code is committed, so building memsnap needs neither.
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="$PATH:$(go env GOPATH)/bin" protoc --go_out=. --go_opt=module=github.com/memsnap/memsnap internal/pb/*.proto
