package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGeneralDocsNameEveryDestinationOrNone(t *testing.T) {
	found, err := lintDir("testdata/outbox")
	require.NoError(t, err)
	var names []string
	for _, f := range found {
		names = append(names, f.name)
	}
	require.Equal(t, []string{"Config.Topics", "Publish"}, names,
		"specific names (SNSLimit, Parse(SQSMessage), kafka.go's Flush), docs naming all four and unexported names pass")
	require.Equal(t, []string{"SNS"}, found[0].named)
	require.Equal(t, []string{"EventBridge", "Kinesis", "Kafka"}, found[0].missing)
}
