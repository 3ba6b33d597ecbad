import { defineValidationSuite } from '../suites/validation.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineValidationSuite(postgresFixture);
