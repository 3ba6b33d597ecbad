import { defineValidationSuite } from '../suites/validation.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineValidationSuite(sqliteFixture);
