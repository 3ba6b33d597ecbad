import { defineDeliverySuite } from '../suites/delivery.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineDeliverySuite(sqliteFixture);
