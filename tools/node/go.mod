// This empty module keeps node_modules (whose aws-cdk package ships Go templates) out of the
// sluice module, so `go build ./...` and `go vet ./...` never descend into it.
module github.com/sluicehq/sluice/tools/node
