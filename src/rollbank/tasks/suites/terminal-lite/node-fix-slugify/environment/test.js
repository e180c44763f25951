'use strict';
const assert = require('node:assert');
const { slugify } = require('./slugify');

assert.strictEqual(slugify('Hello World'), 'hello-world');
assert.strictEqual(slugify('  Crème brûlée!  '), 'creme-brulee');
assert.strictEqual(slugify('a  --  b'), 'a-b');
console.log('all tests passed');
