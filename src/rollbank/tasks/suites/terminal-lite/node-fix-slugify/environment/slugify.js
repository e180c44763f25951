'use strict';

function slugify(text) {
  return text.toLowerCase().replace(' ', '-');
}

module.exports = { slugify };
