'use strict';
const assert = require('node:assert');
const { slugify } = require('/app/slugify.js');

const cases = [
  ['Hello World', 'hello-world'],
  ['  Crème brûlée!  ', 'creme-brulee'],
  ['a  --  b', 'a-b'],
  ['Ångström & Čapek 2024', 'angstrom-capek-2024'],
  ['---', ''],
  ['GRPO: groups_of_8', 'grpo-groups-of-8'],
  ['naïve café', 'naive-cafe'],
  ['x', 'x'],
];
for (const [input, want] of cases) {
  assert.strictEqual(slugify(input), want, `slugify(${JSON.stringify(input)})`);
}
console.log('hidden ok');
